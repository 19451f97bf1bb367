"""Messages Celery itself publishes for PER_CALL tasks (chain links, chord bodies in the
result backend, link callbacks, group members) get their keys by one rule
(celery_idem.producer.derived_key) and run once each, on a real worker."""

from __future__ import annotations

import pytest
from celery import chain, group

from celery_idem.models import Job
from django_app.effects.compat_tasks import (
    add_per_call,
    errback_per_call,
    fail_per_call,
    replaced_by_per_call,
    start_chain,
    sum_per_call,
)
from django_app.effects.models import Effect

from .jobs import TIMEOUT
from .workers import wait_until


def test_a_per_call_task_is_the_callback_of_chords_chained_after_each_other(worker):
    """Celery's test_chain_of_chords_with_two_tasks: the result backend publishes each
    chord body; a PER_CALL body gets its key there."""
    c = chain(add_per_call.si(1, 0), group(add_per_call.s(1), add_per_call.s(1)),
              sum_per_call.s(), add_per_call.s(1),
              group(add_per_call.s(1), add_per_call.s(1)), sum_per_call.s())
    assert c.apply_async(idempotency_key="chords/1").get(timeout=TIMEOUT) == 12
    assert Job.objects.filter(state="SUCCEEDED").count() == 8
    assert Effect.objects.count() == 8


def test_a_chain_of_chords_sent_again_with_its_key_runs_nothing_again(worker):
    """Every derived key descends from the caller's: the same canvas sent twice with one
    key replays each step, its chord bodies included, and makes no second effect."""
    def send():
        c = chain(add_per_call.si(2, 0), group(add_per_call.s(1), add_per_call.s(1)),
                  sum_per_call.s())
        return c.apply_async(idempotency_key="chords/2").get(timeout=TIMEOUT)

    assert send() == send() == 6
    assert Effect.objects.count() == Job.objects.count() == 4


def test_a_per_call_link_callback_gets_its_key_from_the_task_it_follows(worker):
    first = add_per_call.s(2, 3).set(link=add_per_call.s(10)).apply_async(
        idempotency_key="link/1")
    assert first.get(timeout=TIMEOUT) == 5
    wait_until(lambda: Job.objects.filter(state="SUCCEEDED").count() == 2,
               TIMEOUT, what="the link callback")
    callback = Job.objects.exclude(key="link/1").get()
    assert callback.result == 15 and callback.parent_id == Job.objects.get(key="link/1").id


def test_a_per_call_link_error_callback_gets_its_key_from_the_failed_task(worker):
    failed = fail_per_call.s(7).set(link_error=errback_per_call.s()).apply_async(
        idempotency_key="link-error/1")
    with pytest.raises(ValueError):
        failed.get(timeout=TIMEOUT)
    callback = wait_until(lambda: Job.objects.filter(state="SUCCEEDED").first(), TIMEOUT,
                          what="the link_error callback")
    assert callback.result == failed.id
    assert callback.parent_id == Job.objects.get(key="link-error/1").id


def test_a_body_that_returns_the_result_of_a_canvas_it_started_stores_its_tuple(worker):
    """Celery's test_groupresult_serialization: the result is stored as the tuple
    Celery's result backend stores, and a duplicate replays it."""
    first = start_chain.apply_async(idempotency_key="started/1").get(timeout=TIMEOUT)
    again = start_chain.apply_async(idempotency_key="started/1").get(timeout=TIMEOUT)
    assert first == again and len(first) == 2 and isinstance(first[0][1], list)
    assert Job.objects.get(key="started/1").result == first
    assert Effect.objects.filter(key="started/1").count() == 1


def test_a_per_call_replacement_gets_its_key_from_the_replaced_job(worker):
    results = [replaced_by_per_call.delay(8) for _ in range(2)]
    assert [r.get(timeout=TIMEOUT) for r in results] == [16, 16]
    replaced = Job.objects.get(key="replaced-per-call/8")
    assert (replaced.state, replaced.result) == ("SUCCEEDED", 16)
    assert Job.objects.get(parent=replaced).result == 16
    assert Effect.objects.count() == 2
