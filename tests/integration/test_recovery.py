"""Crashes between the effect and the commit, and a broker that loses its messages:
recovery completes every job, once per key where the effect is atomic."""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from celery_idem.admin import display
from celery_idem.admin.timeline import attempts
from celery_idem.conf import settings as idem_settings
from celery_idem.models import Job, Transition
from celery_idem.recovery import sweep as reaper
from django_app.effects.models import Effect
from django_app.effects.tasks import ship_order, wait_for_file, wait_for_file_atomic

from .conftest import broker_redelivers_at_once
from .jobs import TIMEOUT, job, later
from .workers import Worker, purge_queue, wait_until

#: How the broker delivers, requeues, loses or delays messages decides these: every broker
#: tier runs them (tests/run.py).
pytestmark = pytest.mark.delivery


def events(key: str) -> list[tuple[str, int]]:
    return list(Transition.objects.filter(job__key=key).order_by("id")
                .values_list("event", "attempt"))


def start_blocked(task, name: str, folder: Path) -> None:
    """Publish a body that records its effect and blocks, and wait until it is inside."""
    task.delay(name, str(folder))
    if task is wait_for_file_atomic:  # its effect is invisible until the commit
        wait_until(lambda: (folder / f"{name}.started").exists(), TIMEOUT, what="body start")
    else:
        wait_until(lambda: Effect.objects.filter(key=f"wait/{name}").exists(), TIMEOUT,
                   what="the effect row")


def kill_child_of(worker: Worker, key: str, flags: Path) -> None:
    """SIGKILL the pool child that holds the key's claim (atomic: that runs its body)."""
    # "host/pid" of the claim; atomic: uncommitted (broker durability: no row yet either)
    held = Job.objects.filter(key=key).values_list("worker", flat=True).first()
    if held:
        pid = int(held.rsplit("/", 1)[1])
    else:  # atomic: the claim is uncommitted; the body wrote its pid to the .started file
        pid = int((flags / f"{key.split('/', 1)[1]}.started").read_text())
    assert pid in worker.children(), (pid, worker.children())
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: pid not in worker.children(), 30, what="the child to die")


@pytest.fixture
def flags(tmp_path, broker_service, transactional_db):
    purge_queue()
    return tmp_path


def test_child_killed_after_effect_is_released_at_once_and_runs_again(durability, flags):
    """SIGKILL of the pool child: the MainProcess releases the claim, attempt 2 completes;
    the admin shows both attempts' starts (the first kept by the release)."""
    with Worker(concurrency=2) as w:
        start_blocked(wait_for_file, "child", flags)
        first_start = job("wait/child").started_at
        kill_child_of(w, "wait/child", flags)
        (flags / "child").touch()
        wait_until(lambda: "released" in [e for e, _ in events("wait/child")], TIMEOUT,
                   what="the release by the worker")
        reaper.reap()
        wait_until(lambda: job("wait/child").state == "SUCCEEDED", TIMEOUT, what="success")
    released = Transition.objects.get(job__key="wait/child", event="released")
    assert released.reason.startswith("worker lost") and released.attempt == 1
    assert job("wait/child").attempt == 2 and job("wait/child").started_at > released.at
    assert first_start is not None and released.attempt_started_at == first_start
    done = job("wait/child")
    runs = attempts(done, done.transitions.all())
    assert [r["started"] for r in runs] == [display.full_time(first_start),
                                            display.full_time(done.started_at)]
    # Not atomic: the effect before the crash stays, as the protocol's table says.
    assert Effect.objects.filter(key="wait/child").count() == 2


def test_child_killed_in_an_atomic_body_leaves_the_effect_exactly_once(durability, flags):
    """atomic=True: the killed attempt's effect rolled back; one effect, history says so.
    Broker durability: the killed attempt's row rolled back with it, so the requeued
    message inserts it again (attempt 1) and nothing was left to note the loss on."""
    with Worker(concurrency=2) as w:
        start_blocked(wait_for_file_atomic, "achild", flags)
        kill_child_of(w, "wait-atomic/achild", flags)
        (flags / "achild").touch()
        reaper.reap()
        wait_until(lambda: Job.objects.filter(key="wait-atomic/achild",
                                              state="SUCCEEDED").exists(), TIMEOUT,
                   what="success")
    assert Effect.objects.filter(key="wait-atomic/achild").count() == 1
    if durability == "broker":
        assert job("wait-atomic/achild").attempt == 1
        assert events("wait-atomic/achild") == []
        return
    # The attempt that committed claimed after the loss was noted (its claim and success
    # are on the row, not in the history).
    lost = Transition.objects.get(job__key="wait-atomic/achild", event="attempt_lost")
    assert job("wait-atomic/achild").started_at > lost.at


@pytest.mark.pools
def test_whole_worker_killed_after_effect_is_recovered_by_the_reaper(durability, flags, pool):
    """SIGKILL of the whole worker: nothing reports it; the stale claim is released by the
    recovery pass (no worker runs while the clock is moved on) and a new worker on the
    same pool completes attempt 2."""
    first = Worker(pool=pool).start()
    try:
        start_blocked(wait_for_file, "whole", flags)
    finally:
        first.kill()
    (flags / "whole").touch()
    assert job("wait/whole").state == "RUNNING"
    report = reaper.reap(now=later())
    assert report.as_dict() == {"released": {wait_for_file.name: 1}}
    with Worker(pool=pool) as second:
        wait_until(lambda: job("wait/whole").state == "SUCCEEDED", TIMEOUT, what="success")
    first.assert_no_persistence_errors()
    second.assert_no_persistence_errors()
    assert ("released", 1) in events("wait/whole") and job("wait/whole").attempt == 2
    assert Effect.objects.filter(key="wait/whole").count() == 2


@pytest.mark.pools
def test_whole_worker_killed_in_an_atomic_body_runs_the_effect_once(durability, flags, pool):
    """atomic=True, whole worker SIGKILLed: the job was never visibly claimed; the reaper
    re-dispatches the PENDING intent and the effect exists exactly once. Broker
    durability: no row at all, nothing for the reaper; the broker gives the message back
    (RabbitMQ, when the dead worker's connection closes) and it runs once."""
    if durability == "broker":
        return _whole_worker_killed_in_an_atomic_body_without_an_intent(flags, pool)
    first = Worker(pool=pool).start()
    try:
        start_blocked(wait_for_file_atomic, "awhole", flags)
    finally:
        first.kill()
    (flags / "awhole").touch()
    assert job("wait-atomic/awhole").state == "PENDING"
    # The dead worker's transaction holds the row lock until PostgreSQL notices the
    # dropped connection, and SKIP LOCKED passes over a locked row: pass again until the
    # lock is gone (no worker runs meanwhile, so the moved clock claims nothing).
    wait_until(lambda: reaper.reap(now=later()).total("redispatched") == 1, TIMEOUT,
               interval=0.5, what="the re-dispatch of the dead worker's job")
    with Worker(pool=pool) as second:
        wait_until(lambda: job("wait-atomic/awhole").state == "SUCCEEDED", TIMEOUT,
                   what="success")
    first.assert_no_persistence_errors()
    second.assert_no_persistence_errors()
    assert Effect.objects.filter(key="wait-atomic/awhole").count() == 1
    # The killed attempt's claim rolled back with its body: the one committed claim (on
    # the row, attempt 1) is the re-dispatched message's.
    assert "redispatched" in [e for e, _ in events("wait-atomic/awhole")]
    assert job("wait-atomic/awhole").attempt == 1


def _whole_worker_killed_in_an_atomic_body_without_an_intent(flags, pool):
    if not broker_redelivers_at_once():
        pytest.skip("Redis gives an unacknowledged message back only after its visibility "
                    "timeout (an hour), and without an intent nothing else re-sends it: why "
                    "broker durability is for RabbitMQ (check celery_idem.W008)")
    first = Worker(pool=pool).start()
    try:
        start_blocked(wait_for_file_atomic, "bwhole", flags)
    finally:
        first.kill()
    (flags / "bwhole").touch()
    assert not Job.objects.filter(key="wait-atomic/bwhole").exists()
    assert reaper.reap(now=later()).as_dict() == {}
    with Worker(pool=pool) as second:
        # The second worker's claim inserts the row: none until the message comes back.
        wait_until(lambda: Job.objects.filter(key="wait-atomic/bwhole",
                                              state="SUCCEEDED").exists(), TIMEOUT,
                   what="success")
    second.assert_no_persistence_errors()
    assert Effect.objects.filter(key="wait-atomic/bwhole").count() == 1
    assert job("wait-atomic/bwhole").attempt == 1
    assert events("wait-atomic/bwhole") == []


def test_messages_lost_by_the_broker_are_re_dispatched_and_run_once(broker_service,
                                                                     transactional_db):
    """Five jobs published, the broker loses them before any worker starts; the recovery
    pass re-dispatches every PENDING intent and each job finishes once."""
    for n in range(5):
        ship_order.delay(1000 + n)
    purge_queue()  # the broker loses everything queued for this run
    report = reaper.reap(now=timezone.now() + timedelta(
        seconds=idem_settings.DISPATCH_TIMEOUT + 1))
    assert report.as_dict() == {"redispatched": {ship_order.name: 5}}
    with Worker(concurrency=2):
        wait_until(lambda: Job.objects.filter(state="SUCCEEDED").count() == 5, TIMEOUT,
                   what="five successes")
    for n in range(5):
        assert Effect.objects.filter(key=f"ship/{1000 + n}").count() == 1
        assert [e for e, _ in events(f"ship/{1000 + n}")] == ["redispatched"]
        assert job(f"ship/{1000 + n}").attempt == 1


def test_broker_durability_does_not_re_send_a_message_the_broker_lost(
        broker_service, transactional_db, settings):
    """What CELERY_IDEM_DURABILITY = "broker" gives up: the publish wrote nothing, so
    when the broker loses the message no row exists and recovery has nothing to send."""
    settings.CELERY_IDEM_DURABILITY = "broker"
    ship_order.delay(1010)
    purge_queue()  # the broker loses it
    report = reaper.reap(now=timezone.now() + timedelta(
        seconds=idem_settings.DISPATCH_TIMEOUT + 1))
    assert report.as_dict() == {}
    assert not Job.objects.filter(key="ship/1010").exists()


def test_warm_shutdown_leaves_no_claim_behind(durability, worker):
    """SIGTERM while a body runs: the worker finishes it and exits holding no claim."""
    result = ship_order.delay(77, hold=2.0)
    wait_until(lambda: Effect.objects.filter(key="ship/77").exists(), TIMEOUT, what="start")
    worker.stop(timeout=60)
    assert worker.process.returncode is not None
    assert job("ship/77").state == "SUCCEEDED" and result.id
    assert not Job.objects.filter(state="RUNNING").exists()
