"""Batch publishing with real workers (celery_idem.batching): a batch outside a
transaction, one inside atomic() (messages on commit) and a group, each key run once;
a batch whose messages the broker lost is re-sent by recovery, each job from its own
stored message, and runs once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import group
from django.db import transaction
from django.utils import timezone

from celery_idem import batch, publish_many
from celery_idem.conf import settings as idem_settings
from celery_idem.models import Job
from celery_idem.recovery import sweep as reaper
from django_app.effects.models import Effect
from django_app.effects.tasks import ship_order

from .jobs import TIMEOUT
from .workers import Worker, purge_queue, wait_until

pytestmark = pytest.mark.delivery


def _all_succeeded(orders: range) -> bool:
    keys = [f"ship/{n}" for n in orders]
    return Job.objects.filter(key__in=keys, state="SUCCEEDED").count() == len(keys)


def _each_ran_once(orders: range) -> None:
    for n in orders:
        assert Effect.objects.filter(key=f"ship/{n}").count() == 1, n


def test_batches_outside_inside_a_transaction_and_a_group_run_each_key_once(worker):
    """Twenty keys published in a batch (five of them twice), ten in a batch inside
    atomic() and ten as a group through publish_many: one job and one effect per key."""
    outside, inside, grouped = range(2000, 2020), range(2100, 2110), range(2200, 2210)
    with batch():
        for n in outside:
            ship_order.delay(n)
        for n in outside[:5]:
            ship_order.delay(n)  # a repeat: the same job, replayed or waited on
    with transaction.atomic(), batch():
        for n in inside:
            ship_order.delay(n)
    publish_many(group(ship_order.s(n) for n in grouped))
    for orders in (outside, inside, grouped):
        wait_until(lambda orders=orders: _all_succeeded(orders), TIMEOUT,
                   what=f"the batch from {orders.start}")
    for orders in (outside, inside, grouped):
        _each_ran_once(orders)
    assert Job.objects.filter(key__in=[f"ship/{n}" for n in outside]).count() == 20


def test_messages_of_a_batch_the_broker_lost_are_re_sent_and_run_once(broker_service,
                                                                      transactional_db):
    """A batch published with no worker up, its messages lost by the broker: the
    recovery pass re-sends each job's stored message, and each runs once."""
    orders = range(2300, 2308)
    purge_queue()
    publish_many([ship_order.s(n) for n in orders])
    purge_queue()  # the broker loses them
    report = reaper.reap(now=timezone.now() + timedelta(
        seconds=idem_settings.DISPATCH_TIMEOUT + 1))
    assert report.as_dict() == {"redispatched": {ship_order.name: len(orders)}}
    with Worker(concurrency=2):
        wait_until(lambda: _all_succeeded(orders), TIMEOUT, what="the re-sent batch")
    _each_ran_once(orders)
