"""Worker liveness with real workers: a whole worker SIGKILLed or SIGSTOPped under a task
with no time limit and the default lease (an hour) has its claim handed back once it
stops beating, and the new attempt runs; a frozen worker's late commit is fenced out; a
live worker in a long body keeps its claim.

Short liveness settings (``HEARTBEAT``, ``TIMEOUT``) in this process, which runs the
recovery passes, and in the workers. Each test prints how long the hand-back took."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from celery_idem.conf import settings as idem_settings
from celery_idem.models import Job, Transition, WorkerHeartbeat
from celery_idem.recovery import sweep as reaper
from celery_idem.recovery.liveness import OBSERVER
from django_app.effects.models import Effect
from django_app.effects.tasks import wait_for_file, wait_per_attempt

from .conftest import FULL_MATRIX
from .jobs import TIMEOUT, job
from .workers import ROOT, Worker, purge_queue, wait_until, worker_env

#: Seconds between beats, and of silence before recovery presumes a worker dead.
HEARTBEAT = 0.5
SILENCE = 5


@pytest.fixture
def flags(tmp_path, broker_service, transactional_db, settings, monkeypatch):
    """A folder for the bodies' flags; the liveness settings here and in the workers."""
    for name, value in (("WORKER_HEARTBEAT", HEARTBEAT), ("WORKER_TIMEOUT", SILENCE)):
        setattr(settings, f"CELERY_IDEM_{name}", value)
        monkeypatch.setenv(f"CELERY_IDEM_{name}", json.dumps(value))
    purge_queue()
    return tmp_path


def released_by_recovery(key: str) -> Transition | None:
    """One recovery pass, then the key's ``released`` line if there is one."""
    reaper.reap()
    return Transition.objects.filter(job__key=key, event="released").first()


def beating(claimed: Job) -> bool:
    """Whether the claim names a worker that has a heartbeat row."""
    return WorkerHeartbeat.objects.filter(worker=claimed.worker.rsplit("/", 1)[0]).exists()


@pytest.mark.pools
def test_whole_worker_killed_its_claim_comes_back_by_liveness_not_the_lease(flags, pool):
    """SIGKILL of the whole worker in a body with no time limit (lease: an hour): the
    recovery pass hands the claim back once the worker is silent for the timeout, long
    before the lease ends, and a new worker runs attempt 2."""
    first = Worker(pool=pool).start()
    try:
        wait_for_file.delay("lively", str(flags))
        wait_until(lambda: Effect.objects.filter(key="wait/lively").exists(), TIMEOUT,
                   what="the body to start")
        claimed = job("wait/lively")
        assert beating(claimed), claimed.worker
        assert claimed.lease_expires_at - claimed.started_at == timedelta(seconds=3600)
    finally:
        first.kill()
    killed = timezone.now()
    (flags / "lively").touch()
    released = wait_until(lambda: released_by_recovery("wait/lively"), TIMEOUT, interval=0.5,
                          what="the hand-back by liveness")
    assert released.reason.startswith("worker stopped beating"), released.reason
    assert released.at < claimed.lease_expires_at and released.attempt == 1
    with Worker(pool=pool) as second:
        wait_until(lambda: job("wait/lively").state == "SUCCEEDED", TIMEOUT, what="success")
    second.assert_no_persistence_errors()
    assert job("wait/lively").attempt == 2
    print(f"\n{pool}: SIGKILL -> released in {(released.at - killed).total_seconds():.1f}s "
          f"(heartbeat {HEARTBEAT}s, timeout {SILENCE}s)")


def test_frozen_worker_loses_its_claim_and_its_late_commit_is_fenced(flags):
    """SIGSTOP of the whole worker (a zombie): its claim is handed back, attempt 2 runs on
    another worker and succeeds; resumed, the zombie finishes attempt 1, whose commit is
    refused (``late_finish``): the outcome is attempt 2's."""
    zombie = Worker().start()
    try:
        wait_per_attempt.delay("zombie", str(flags))
        wait_until(lambda: Effect.objects.filter(key="attempt/zombie").exists(), TIMEOUT,
                   what="attempt 1 to start")
        assert beating(job("attempt/zombie"))
        os.killpg(zombie.pid, signal.SIGSTOP)
        stopped = timezone.now()
        released = wait_until(lambda: released_by_recovery("attempt/zombie"), TIMEOUT,
                              interval=0.5, what="the hand-back by liveness")
        assert released.reason.startswith("worker stopped beating"), released.reason
        (flags / "zombie-2").touch()
        with Worker(concurrency=1) as second:
            wait_until(lambda: job("attempt/zombie").state == "SUCCEEDED", TIMEOUT,
                       what="attempt 2 to succeed")
        second.assert_no_persistence_errors()
        os.killpg(zombie.pid, signal.SIGCONT)
        (flags / "zombie-1").touch()
        late = wait_until(lambda: Transition.objects.filter(
            job__key="attempt/zombie", event="late_finish").first(), TIMEOUT,
            what="the zombie's refused commit")
    finally:
        if zombie.process is not None and zombie.process.poll() is None:
            os.killpg(zombie.pid, signal.SIGCONT)
        zombie.stop()
    assert late.attempt == 1
    done = job("attempt/zombie")
    assert (done.state, done.attempt, done.result) == (
        "SUCCEEDED", 2, {"name": "zombie", "attempt": 2})
    # Not atomic: attempt 1's effect stays beside attempt 2's, as the protocol's table says.
    assert sorted(Effect.objects.filter(key="attempt/zombie")
                  .values_list("attempt", flat=True)) == [1, 2]
    print(f"\nSIGSTOP -> released in {(released.at - stopped).total_seconds():.1f}s "
          f"(heartbeat {HEARTBEAT}s, timeout {SILENCE}s)")


@pytest.mark.pools
def test_a_live_worker_in_a_long_body_keeps_its_claim(flags, pool):
    """A body that runs past the timeout under a live worker (in the MainProcess itself on
    solo): recovery watches it for longer than the timeout and hands nothing back."""
    with Worker(pool=pool) as w:
        wait_for_file.delay("long", str(flags))
        wait_until(lambda: Effect.objects.filter(key="wait/long").exists(), TIMEOUT,
                   what="the body to start")
        started = job("wait/long").started_at

        def watched_past_the_timeout() -> bool:
            # A pass that would presume a worker silent since the claim dead: its cutoff
            # (a timeout back) after the claim's next beat, recovery watching since then.
            reaper.reap()
            since, last = WorkerHeartbeat.objects.filter(worker=OBSERVER).values_list(
                "started_at", "beat_at").get()
            cutoff = last - timedelta(seconds=SILENCE)
            return cutoff >= since and cutoff > started + timedelta(seconds=HEARTBEAT)

        wait_until(watched_past_the_timeout, TIMEOUT, interval=0.5,
                   what="recovery to watch the body past the timeout")
        held = job("wait/long")
        assert (held.state, held.attempt) == ("RUNNING", 1)
        assert not Transition.objects.filter(job__key="wait/long", event="released").exists()
        assert beating(held)
        (flags / "long").touch()
        wait_until(lambda: job("wait/long").state == "SUCCEEDED", TIMEOUT, what="success")
    w.assert_no_persistence_errors()


def watching_for_a_timeout() -> bool:
    """Whether recovery's watch began a whole CELERY_IDEM_WORKER_TIMEOUT ago."""
    since = WorkerHeartbeat.objects.filter(worker=OBSERVER).values_list(
        "started_at", flat=True).first()
    return since is not None and since <= timezone.now() - timedelta(
        seconds=idem_settings.WORKER_TIMEOUT)


@pytest.mark.skipif(not FULL_MATRIX, reason="a minute of real time with the default "
                                            "settings: with --full (IDEM_FULL_MATRIX=1)")
def test_with_the_defaults_and_beat_a_killed_worker_s_claim_comes_back_by_liveness(
        broker_service, transactional_db, tmp_path):
    """The defaults end to end: heartbeats every 5 s, a 30 s timeout, ``celery beat``
    sending the pass every 15 s to a second worker. The whole worker holding the claim is
    SIGKILLed; the pass hands the claim back by liveness and the other worker runs
    attempt 2. Prints the time from the kill to the hand-back and to the success."""
    purge_queue()
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "django_app", "beat", "-l", "INFO",
         "-s", str(tmp_path / "schedule")],
        env=worker_env(DJANGO_SETTINGS_MODULE="tests.integration.beat_liveness_settings"),
        cwd=ROOT, stdout=(tmp_path / "beat.log").open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    workers = [Worker().start(), Worker().start()]
    try:
        wait_for_file.delay("defaults", str(tmp_path))
        wait_until(lambda: Effect.objects.filter(key="wait/defaults").exists(), TIMEOUT,
                   what="the body to start")
        claimed = job("wait/defaults")
        assert beating(claimed)
        # As in production, recovery has been watching for a whole timeout already (a
        # watch that starts later adds its wait: docs/how-to/recovery.md).
        wait_until(watching_for_a_timeout, TIMEOUT, interval=1, what="recovery's watch")
        holder = next(w for w in workers if claimed.worker.startswith(f"{w.name}@"))
        holder.kill()
        killed = timezone.now()
        (tmp_path / "defaults").touch()
        wait_until(lambda: job("wait/defaults").state == "SUCCEEDED", TIMEOUT,
                   what="attempt 2 to succeed")
    finally:
        beat.terminate()
        beat.wait(timeout=30)
        for w in workers:
            w.stop()
    released = Transition.objects.get(job__key="wait/defaults", event="released")
    assert released.reason.startswith("worker stopped beating"), released.reason
    done = job("wait/defaults")
    assert done.attempt == 2 and released.at < claimed.lease_expires_at
    print(f"\ndefaults (heartbeat 5s, timeout 40s, a pass every 10s): SIGKILL -> released "
          f"in {(released.at - killed).total_seconds():.1f}s, attempt 2 succeeded in "
          f"{(done.finished_at - killed).total_seconds():.1f}s")
