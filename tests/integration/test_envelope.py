"""The job row carries the message (issue 13), with real workers: a re-send behaves as
the original. Lost links, chains and chord headers fire once after recovery; an ETA is
never run early; an expired message never runs; a lost retry continues the retry count;
a task no worker knows ends undeliverable."""

from __future__ import annotations

from datetime import datetime, timedelta
from urllib.parse import urlparse

import pytest
from celery import chain, chord
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from celery_idem import actions
from celery_idem.conf import settings as idem_settings
from celery_idem.models import Job, Transition
from celery_idem.recovery import sweep as reaper
from django_app.effects.models import Effect
from django_app.effects.tasks import add, collect, notify, retries_twice, ship_order

from .workers import Worker, purge_queue, wait_until

#: How the broker delivers, requeues, loses or delays messages decides these: every broker
#: tier runs them (tests/run.py).
pytestmark = pytest.mark.delivery

TIMEOUT = 90


def effects(**value) -> int:
    return sum(1 for e in Effect.objects.all() if all(e.value.get(k) == v
                                                      for k, v in value.items()))


def events(key: str) -> list[str]:
    return list(Transition.objects.filter(job__key=key).order_by("id")
                .values_list("event", flat=True))


def past_dispatch_timeout() -> datetime:
    return timezone.now() + timedelta(seconds=idem_settings.DISPATCH_TIMEOUT + 1)


@pytest.fixture
def db(broker_service, transactional_db):
    return broker_service


def test_lost_link_chain_and_chord_header_fire_once_after_recovery(db):
    """The broker loses a task with link/link_error, a chain and a chord's header before
    any worker runs: after recovery each body ran once, the link once (the errback never),
    the chain's next step once, the chord's callback once."""
    ship_order.apply_async((501,), link=notify.si(501, "linked"),
                           link_error=notify.si(501, "errback"))
    chain(ship_order.si(502), add.si(502, 1)).apply_async()
    with_chord = urlparse(settings.CELERY_RESULT_BACKEND).scheme == "redis"
    if with_chord:  # chord counting in the result store (other stores poll by task id)
        chord([add.si(601, 0), add.si(602, 0)])(collect.s("c1"))
    purge_queue()  # the broker loses the queued messages
    report = reaper.reap(now=past_dispatch_timeout())
    assert report.total("redispatched") == (4 if with_chord else 2)
    with Worker(concurrency=2):
        wait_until(lambda: effects(x=502, y=1) == 1 and effects(text="linked") == 1
                   and (not with_chord or effects(tag="c1") == 1), TIMEOUT,
                   what="the link, the chain's next step and the chord's callback")
    assert Effect.objects.filter(key="ship/501").count() == 1
    assert Effect.objects.filter(key="ship/502").count() == 1
    assert (effects(text="linked"), effects(text="errback"), effects(x=502, y=1)) == (1, 0, 1)
    if with_chord:
        assert (effects(x=601), effects(x=602), effects(tag="c1")) == (1, 1, 1)
        assert effects(tag="c1", results=[601, 602]) == 1


def test_eta_beyond_the_dispatch_timeout_is_never_sent_early(db):
    """countdown 20 s with a 2 s dispatch timeout: recovery passes with the clock moved
    past the timeout (but before the ETA) send nothing; the job runs once, at its ETA."""
    with override_settings(CELERY_IDEM_DISPATCH_TIMEOUT=2), \
            Worker(concurrency=2) as worker:
        result = ship_order.apply_async((701,), countdown=20)
        eta = timezone.now() + timedelta(seconds=20)
        for ahead in (5, 15):
            report = reaper.reap(now=timezone.now() + timedelta(seconds=ahead))
            assert report.total("redispatched") == 0, report
        wait_until(lambda: Job.objects.get(key="ship/701").state == "SUCCEEDED", 60,
                   what="the job at its ETA")
        assert result.id and worker.process.poll() is None
    job = Job.objects.get(key="ship/701")
    assert job.started_at >= eta - timedelta(seconds=1)
    assert Effect.objects.filter(key="ship/701").count() == 1
    assert job.attempt == 1 and events("ship/701") == []  # claimed once, at its ETA


def test_an_expired_message_never_runs_and_an_operator_retry_runs_it_once(db):
    """expires=1 s and no worker until it passed: the message is dropped (by the worker
    on Redis, by RabbitMQ's per-message TTL before any worker sees it, then the recovery
    pass notices), the job ends EXPIRED, a duplicate gets the Expired error, an
    operator's retry runs it once."""

    def expired() -> bool:
        if Job.objects.get(key="ship/801").state == "PENDING":
            reaper.reap()
        return Job.objects.get(key="ship/801").state == "EXPIRED"

    ship_order.apply_async((801,), expires=1)
    deadline = Job.objects.get(key="ship/801").expires_at
    wait_until(lambda: timezone.now() > deadline, 10, what="the expiry")
    with Worker(concurrency=2):
        wait_until(expired, TIMEOUT, interval=0.5, what="the expired message to be dropped")
        assert Effect.objects.filter(key="ship/801").count() == 0
        duplicate = ship_order.delay(801)
        # A replay of a finished key writes nothing: wait for its answer instead.
        wait_until(duplicate.ready, TIMEOUT, what="the duplicate's answer")
        assert duplicate.failed() and "Expired" in repr(duplicate.result)
        assert Effect.objects.filter(key="ship/801").count() == 0
        outcome = actions.retry(Job.objects.get(key="ship/801"), actor="op")
        assert outcome.done
        wait_until(lambda: Job.objects.get(key="ship/801").state == "SUCCEEDED", TIMEOUT,
                   what="the operator's retry")
    assert Effect.objects.filter(key="ship/801").count() == 1
    assert reaper.reap(now=past_dispatch_timeout()).total("redispatched") == 0


def test_a_lost_retry_message_continues_the_retry_count(db):
    """max_retries=2 and the first retry's message is lost: the re-sent message is the
    retry itself (retries=1), so the task runs at most 3 attempts, not 5."""
    with Worker(concurrency=1):
        retries_twice.delay(901, first_countdown=15)
        wait_until(lambda: "retry_scheduled" in events("retries/901"), TIMEOUT,
                   what="the first retry")
    purge_queue()  # the broker loses the queued messages
    job = Job.objects.get(key="retries/901")
    assert job.message["headers"]["retries"] == 1
    report = reaper.reap(now=job.not_before + timedelta(
        seconds=idem_settings.DISPATCH_TIMEOUT + 1))
    assert report.total("redispatched") == 1
    with Worker(concurrency=1):
        wait_until(lambda: Job.objects.get(key="retries/901").state == "FAILED", TIMEOUT,
                   what="the retries to run out")
    assert Effect.objects.filter(key="retries/901").count() == 3
    assert sorted(e.value["retries"] for e in Effect.objects.filter(key="retries/901")) == \
        [0, 1, 2]


def test_a_task_no_worker_knows_ends_undeliverable(db):
    """A job whose task was renamed away: sent a bounded number of times to a worker
    that does not know it, then FAILED as undeliverable, never sent again."""
    ship_order.delay(951)
    purge_queue()  # the broker loses the queued messages
    # The stored message names no task (format 2): the re-send takes the row's.
    Job.objects.filter(key="ship/951").update(task_name="effects.renamed_away")
    clock = timezone.now()
    with override_settings(CELERY_IDEM_MAX_REDISPATCHES=2), Worker(concurrency=1) as w:
        for _ in range(4):
            clock += timedelta(seconds=idem_settings.DISPATCH_MAX_BACKOFF + 1)
            reaper.reap(now=clock)
        wait_until(lambda: w.log().count("effects.renamed_away") >= 2, TIMEOUT,
                   what="the worker to refuse the unknown task twice")
    job = Job.objects.get(key="ship/951")
    assert (job.state, job.error["type"], job.dispatch_count) == ("FAILED", "Undeliverable", 2)
    assert Effect.objects.filter(key="ship/951").count() == 0
