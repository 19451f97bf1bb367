"""The recovery schedule under a real ``celery beat``: Celery's default scheduler and
django-celery-beat's DatabaseScheduler both run the pass, which releases a stale claim."""

from __future__ import annotations

import subprocess
import sys

import pytest

from celery_idem import claims
from celery_idem.beat import ENTRY_NAME, TASK_NAME
from celery_idem.models import Job
from celery_idem.producer import write_intent
from django_app.effects.tasks import ship_order

from .workers import ROOT, wait_until, worker_env

TIMEOUT = 120
SCHEDULERS = {
    "default": "celery.beat:PersistentScheduler",
    "database": "django_celery_beat.schedulers:DatabaseScheduler",
}


def stale_claim(n: int) -> Job:
    """A job whose worker vanished: RUNNING under a lease that has already expired."""
    intent = ship_order.intent((n,), {})
    write_intent(intent, f"pub-{n}")
    claims.acquire(intent, worker="gone@host/1", task_id=f"t-{n}", lease_seconds=0,
                   using="default")
    return Job.objects.get(key=intent.key)


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_beat_runs_the_recovery_pass_that_completes_a_stale_job(scheduler, worker, tmp_path):
    """Beat sends the pass every second; the stale claim is released, re-run, finished."""
    if scheduler == "database":
        pytest.importorskip("django_celery_beat", reason="django-celery-beat not installed")
    job = stale_claim(3)
    assert job.state == "RUNNING"
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "django_app", "beat", "-l", "INFO",
         "-S", SCHEDULERS[scheduler], "-s", str(tmp_path / "schedule"), "--max-interval", "1"],
        env=worker_env(DJANGO_SETTINGS_MODULE="tests.integration.beat_settings"), cwd=ROOT,
        stdout=(tmp_path / "beat.log").open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        wait_until(lambda: Job.objects.get(pk=job.pk).state == "SUCCEEDED", TIMEOUT,
                   what=f"the stale job to finish; beat log:\n"
                        f"{(tmp_path / 'beat.log').read_text(errors='replace')}")
    finally:
        beat.terminate()
        beat.wait(timeout=30)
    events = list(job.transitions.order_by("id").values_list("event", flat=True))
    # The stale claim went back (released), and the next attempt claimed and succeeded
    # (the happy path's moves are on the row, not in the history).
    assert events[0] == "released" and "succeeded" not in events
    finished = Job.objects.get(pk=job.pk)
    assert finished.attempt >= 2 and finished.finished_at is not None
    if scheduler == "database":
        from django_celery_beat.models import PeriodicTask

        row = PeriodicTask.objects.get(name=ENTRY_NAME)
        assert (row.task, row.interval.every, row.interval.period, row.expire_seconds) == \
            (TASK_NAME, 1, "seconds", 1)


def test_a_worker_registers_the_recovery_task_under_its_stable_name(worker):
    """The worker finds celery_idem.tasks by autodiscovery and runs the pass by name."""
    from django_app.celery import app

    result = app.send_task(TASK_NAME)
    assert result.get(timeout=TIMEOUT) == {}
