"""Issue 11 item 4: the guarantee of the one-statement atomic PROTOTYPE (bench/onestmt.py,
not the library) with real prefork workers: concurrent duplicates that both run the
body, a worker SIGKILLed in the middle of the body, a message scheduled for later.

The crash tests run today's atomic path (``wait_for_file_atomic``) beside the prototype
(``wait_for_file_atomic1``), so the two are compared under the same crash. Workers import
the prototype's tasks with ``-I bench.onestmt``.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import pytest
from bench.onestmt import deduct_once_atomic1, lock_nowait_atomic1, wait_for_file_atomic1
from django.conf import settings
from django.utils import timezone

from celery_idem.models import Transition
from celery_idem.recovery import sweep as reaper
from django_app.effects.models import Effect, Stock, StockDeduction
from django_app.effects.tasks import wait_for_file_atomic

from .jobs import TIMEOUT, job, later
from .test_recovery import events
from .workers import Worker, purge_queue, wait_until

pytestmark = pytest.mark.skipif(
    settings.DATABASE_KIND != "postgres"
    or urlparse(settings.CELERY_BROKER_URL).scheme != "redis",
    reason="the prototype is PostgreSQL's; its tests run in the postgres+redis tier")

INCLUDE = ("-I", "bench.onestmt")

#: (task, key prefix): today's atomic path and the prototype, under the same crash.
PATHS = [pytest.param(wait_for_file_atomic, "wait-atomic", id="atomic"),
         pytest.param(wait_for_file_atomic1, "wait-atomic1", id="atomic1")]


@pytest.fixture
def flags(tmp_path, broker_service, transactional_db):
    purge_queue()
    return tmp_path


def started(folder: Path, name: str) -> list[int]:
    """Pids of the bodies of ``name`` that started (each wrote ``name[.pid].started``)."""
    return sorted(int(p.read_text()) for p in folder.glob(f"{name}*.started"))


def start_blocked(task, name: str, folder: Path) -> int:
    """Publish a body that writes its effect and blocks; the pid once it is inside."""
    task.delay(name, str(folder))
    return wait_until(lambda: (started(folder, name) or [None])[0], TIMEOUT,
                      what="the body to start")


def test_concurrent_duplicates_both_run_the_body_and_the_effect_lands_once(flags):
    """Two messages of one key, both bodies inside at once (a barrier holds each until
    both started): one conditional commit wins, the other rolls its body back and
    replays the winner's result. One effect, one attempt, both callers equal."""
    with Worker(concurrency=2, extra_args=INCLUDE):
        results = [wait_for_file_atomic1.delay("dup", str(flags), 2) for _ in range(2)]
        values = [r.get(timeout=TIMEOUT) for r in results]
    assert len(started(flags, "dup")) == 2  # both bodies ran, concurrently
    assert values[0] == values[1] and values[0]["pid"] in started(flags, "dup")
    assert Effect.objects.filter(key="wait-atomic1/dup").count() == 1
    assert (job("wait-atomic1/dup").state, job("wait-atomic1/dup").attempt) == ("SUCCEEDED", 1)
    assert events("wait-atomic1/dup") == []


def test_a_unique_violation_between_duplicates_is_lost_not_failed(flags):
    """Both copies insert the same (order, sku) row: the second waits on the first's
    uncommitted unique entry, then fails with a unique violation when it commits. The
    prototype classifies that as a lost race (replay), not a failure of the key."""
    with Worker(concurrency=2, extra_args=INCLUDE):
        results = [deduct_once_atomic1.delay(5, "sku-1", str(flags)) for _ in range(2)]
        values = [r.get(timeout=TIMEOUT) for r in results]
    assert len(started(flags, "deduct-5-sku-1")) == 2
    assert values[0] == values[1] == {"deducted": 1, "pid": values[0]["pid"]}
    assert StockDeduction.objects.filter(order_id=5, sku="sku-1").count() == 1
    assert job("deduct1/5/sku-1").state == "SUCCEEDED"


def test_a_lock_conflict_before_the_winner_commits_waits_instead_of_failing_the_key(flags):
    """The first copy holds the product's row lock in its body; the duplicate's NOWAIT
    fails (55P03) while the first has not committed, so the job is still PENDING. Were
    that a failure, the duplicate would claim the key and make it FAILED, and the first
    copy's commit would then lose: no effect at all. The prototype waits and comes back
    (it runs the body again then, and replays)."""
    Stock.objects.create(sku="n1", quantity=10)
    with Worker(concurrency=2, extra_args=INCLUDE) as w:
        first = lock_nowait_atomic1.delay("n1", str(flags))
        wait_until(lambda: started(flags, "nowait-n1"), TIMEOUT, what="the first body")
        dup = lock_nowait_atomic1.delay("n1", str(flags))
        wait_until(lambda: f"[{dup.id}] retry:" in w.log(), TIMEOUT,
                   what="the duplicate's lock conflict")
        assert job("nowait1/n1").state == "PENDING"
        (flags / "nowait-n1").touch()
        values = [first.get(timeout=TIMEOUT), dup.get(timeout=TIMEOUT)]
    assert values[0] == values[1] == {"quantity": 9, "pid": values[0]["pid"]}
    assert Stock.objects.get(sku="n1").quantity == 9
    assert (job("nowait1/n1").state, job("nowait1/n1").attempt) == ("SUCCEEDED", 1)


@pytest.mark.parametrize(("task", "prefix"), PATHS)
def test_child_killed_in_the_body_is_redelivered_and_the_effect_lands_once(flags, task,
                                                                          prefix):
    """SIGKILL of the pool child inside the body, before any commit: the transaction dies
    with it, the message comes back (acks_late, reject_on_worker_lost) and the next
    delivery commits. The effect exists once; the lost attempt is in the history."""
    key = f"{prefix}/kchild"
    with Worker(concurrency=2, extra_args=INCLUDE) as w:
        pid = start_blocked(task, "kchild", flags)
        assert pid in w.children()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: pid not in w.children(), 30, what="the child to die")
        (flags / "kchild").touch()
        wait_until(lambda: job(key).state == "SUCCEEDED", TIMEOUT, what="success")
        w.assert_no_persistence_errors()
    assert Effect.objects.filter(key=key).count() == 1
    lost = Transition.objects.get(job__key=key, event="attempt_lost")
    assert job(key).attempt == 1 and job(key).started_at > lost.at
    if task is wait_for_file_atomic1:  # the killed body and the one that committed
        assert len(started(flags, "kchild")) == 2


@pytest.mark.parametrize(("task", "prefix"), PATHS)
def test_whole_worker_killed_in_the_body_runs_the_effect_once(flags, task, prefix):
    """SIGKILL of the whole worker inside the body: the job is still PENDING; the recovery
    pass re-dispatches it (today's path: once PostgreSQL dropped the dead transaction's
    row lock, which SKIP LOCKED passes over) and a new worker commits it once."""
    key = f"{prefix}/kwhole"
    first = Worker(concurrency=2, extra_args=INCLUDE).start()
    try:
        start_blocked(task, "kwhole", flags)
    finally:
        first.kill()
    (flags / "kwhole").touch()
    assert job(key).state == "PENDING"
    wait_until(lambda: reaper.reap(now=later()).total("redispatched") == 1, TIMEOUT,
               interval=0.5, what="the re-dispatch of the dead worker's job")
    with Worker(concurrency=2, extra_args=INCLUDE) as second:
        wait_until(lambda: job(key).state == "SUCCEEDED", TIMEOUT, what="success")
        second.assert_no_persistence_errors()
    assert Effect.objects.filter(key=key).count() == 1
    assert "redispatched" in [e for e, _ in events(key)] and job(key).attempt == 1


def test_a_duplicate_before_the_eta_runs_the_body_but_its_effect_rolls_back(flags):
    """A message scheduled an hour ahead (not_before on the row) and a duplicate without
    an ETA: the worker holds the first until its ETA; the duplicate runs the body (the
    prototype checks not_before only in its commit), loses on not_before, rolls back and
    waits. Nothing lands early: no effect, the job PENDING at attempt 0."""
    (flags / "later").touch()  # no body blocks
    with Worker(concurrency=2, extra_args=INCLUDE) as w:
        wait_for_file_atomic1.apply_async(("later", str(flags)), countdown=3600)
        dup = wait_for_file_atomic1.delay("later", str(flags))
        wait_until(lambda: f"[{dup.id}] retry:" in w.log(), TIMEOUT,
                   what="the duplicate to lose and wait")
        assert Effect.objects.filter(key="wait-atomic1/later").count() == 0
        row = job("wait-atomic1/later")
        assert (row.state, row.attempt) == ("PENDING", 0) and row.not_before > timezone.now()
    assert started(flags, "later")  # the duplicate's body did run, and rolled back


def test_a_message_with_an_eta_commits_at_its_eta_once(flags):
    """countdown 5 s plus a duplicate at once: the effect that lands is from a body that
    ran at or after the ETA, once."""
    (flags / "soon").touch()
    with Worker(concurrency=2, extra_args=INCLUDE):
        eta = timezone.now() + timedelta(seconds=5)
        wait_for_file_atomic1.apply_async(("soon", str(flags)), eta=eta)
        wait_for_file_atomic1.delay("soon", str(flags))
        wait_until(lambda: job("wait-atomic1/soon").state == "SUCCEEDED", TIMEOUT,
                   what="the job at its ETA")
    effect = Effect.objects.get(key="wait-atomic1/soon")
    assert effect.created_at >= eta - timedelta(seconds=1)
    assert job("wait-atomic1/soon").started_at >= eta - timedelta(seconds=1)
