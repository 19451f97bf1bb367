"""Canvas messages stored in the lean format (format 2) and lost by the broker after the
canvas started, with real workers: the re-send, rebuilt from the row, carries the chain's
next steps, the chord it belongs to and the link/link_error callbacks, so each fires once.

The lost message goes to a queue of its own that no worker consumes until the broker
"lost" it (purged) and recovery sent it again."""

from __future__ import annotations

import pytest
from celery import chain, chord
from django.conf import settings

from celery_idem import lean_envelope
from celery_idem.models import Job
from celery_idem.recovery import sweep as reaper
from django_app.celery import app
from django_app.effects.models import Effect
from django_app.effects.tasks import add, always_fails, collect, notify, ship_order

from .test_envelope import TIMEOUT, effects, past_dispatch_timeout
from .workers import Worker, purge_queue, wait_until

pytestmark = pytest.mark.delivery

HELD = f"{settings.CELERY_TASK_DEFAULT_QUEUE}-held"


@pytest.fixture
def db(broker_service, transactional_db):
    purge_queue()
    lose_held()
    return broker_service


def lose_held() -> None:
    """The broker loses every message on the held queue."""
    with app.connection_for_write() as conn:
        app.amqp.queues[HELD].bind(conn.default_channel).declare()
        conn.default_channel.queue_purge(HELD)


def both_queues() -> Worker:
    return Worker(concurrency=2, extra_args=(
        "-Q", f"{settings.CELERY_TASK_DEFAULT_QUEUE},{HELD}"))


def lost_and_re_sent(key: str) -> None:
    """``key``'s message is on the held queue: the broker loses it, recovery re-sends it
    from its row (a lean envelope)."""
    wait_until(lambda: Job.objects.filter(key=key).exists(), TIMEOUT, what=f"{key}'s intent")
    job = Job.objects.get(key=key)
    assert job.message["v"] == lean_envelope.VERSION and "args" not in job.message
    lose_held()
    assert reaper.reap(now=past_dispatch_timeout()).total("redispatched") == 1


def test_a_lost_chain_step_sent_again_continues_the_chain(db):
    """chain(add, ship_order, add): the first step ran, the second step's message (sent
    by the worker) was lost; after recovery the second runs once and the third once."""
    with Worker(concurrency=2):
        chain(add.si(1001, 0), ship_order.si(1001).set(queue=HELD),
              add.si(1001, 5)).apply_async()
        wait_until(lambda: effects(x=1001, y=0) == 1, TIMEOUT, what="the first step")
        lost_and_re_sent("ship/1001")
    with both_queues():
        wait_until(lambda: effects(x=1001, y=5) == 1, TIMEOUT, what="the chain's last step")
    assert Effect.objects.filter(key="ship/1001").count() == 1
    assert (effects(x=1001, y=0), effects(x=1001, y=5)) == (1, 1)


def test_a_lost_failing_task_sent_again_fires_its_errback_not_its_link(db):
    """A task with link and link_error, lost: the re-send fails once, the errback runs
    once, the link never."""
    always_fails.apply_async((1101,), queue=HELD, link=notify.si(1101, "linked"),
                             link_error=notify.si(1101, "errback"))
    lost_and_re_sent("fail/1101")
    with both_queues():
        wait_until(lambda: effects(text="errback") == 1, TIMEOUT, what="the errback")
        wait_until(lambda: Job.objects.get(key="fail/1101").state == "FAILED", TIMEOUT,
                   what="the failure")
    assert (effects(text="errback"), effects(text="linked")) == (1, 0)
    assert Effect.objects.filter(key="fail/1101").count() == 1


def test_a_lost_chord_header_member_sent_again_completes_the_chord(db):
    """chord([add, add]) with one member's message lost after the other ran: the re-send
    counts towards the same chord; its callback fires once with both results."""
    if not str(settings.CELERY_RESULT_BACKEND).startswith("redis"):
        pytest.skip("chord counting in the result store: the Redis result backend")
    with Worker(concurrency=2):
        chord([add.si(1201, 0), add.si(1202, 0).set(queue=HELD)])(collect.s("c2"))
        wait_until(lambda: effects(x=1201, y=0) == 1, TIMEOUT, what="the first member")
        lost_and_re_sent(add.intent((1202, 0)).key)
    with both_queues():
        wait_until(lambda: effects(tag="c2") == 1, TIMEOUT, what="the chord's callback")
    assert (effects(x=1201, y=0), effects(x=1202, y=0)) == (1, 1)
    assert effects(tag="c2", results=[1201, 1202]) == 1
    assert Job.objects.get(key="collect/c2").state == "SUCCEEDED"


def test_a_row_in_the_full_format_is_sent_again_and_runs_once(db):
    """A row written before format 2 (its message the full envelope, format 1): the
    broker loses it, recovery sends the stored envelope, a worker runs it once."""
    ship_order.apply_async((1301,), queue=HELD)
    job = Job.objects.get(key="ship/1301")
    full = lean_envelope.expand(app, job.message, job, job.task_id)
    assert full["v"] == 1 and full["body"][0] == [1301]
    Job.objects.filter(id=job.id).update(message=full)
    lose_held()
    assert reaper.reap(now=past_dispatch_timeout()).total("redispatched") == 1
    with both_queues():
        wait_until(lambda: Job.objects.get(key="ship/1301").state == "SUCCEEDED", TIMEOUT,
                   what="the re-sent job")
    assert Effect.objects.filter(key="ship/1301").count() == 1
