"""Retention from beat: purge_schedule's entry, and the task it runs deleting what
idem_purge would (finished jobs past the retention, with their history), in batches."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery.beat import PersistentScheduler
from freezegun import freeze_time

import celery_idem.tasks  # noqa: F401  (a worker's autodiscovery registers the task)
from celery_idem.beat import PURGE_ENTRY_NAME, PURGE_TASK_NAME, purge_schedule
from celery_idem.models import Job, Transition
from django_app.celery import app
from tests.db.test_commands import job_in


def test_the_entry_names_the_task_its_interval_expiry_and_retention():
    entry = purge_schedule(7, 600, queue="maintenance", batch_size=500)[PURGE_ENTRY_NAME]
    assert entry == {"task": PURGE_TASK_NAME, "schedule": timedelta(seconds=600),
                     "kwargs": {"older_than_days": 7, "batch_size": 500},
                     "options": {"expires": 600, "expire_seconds": 600,
                                 "queue": "maintenance"}}
    assert "kwargs" not in purge_schedule()[PURGE_ENTRY_NAME]  # the setting, at run time


@pytest.mark.parametrize("args", [{"older_than": 0}, {"interval": 0.5}])
def test_a_retention_or_interval_out_of_range_is_refused(args):
    with pytest.raises(ValueError, match="more than 0 days|at least 1 second"):
        purge_schedule(**args)


def test_celerys_default_scheduler_takes_the_entry(tmp_path):
    saved = app.conf.beat_schedule
    app.conf.beat_schedule = purge_schedule(3)
    scheduler = PersistentScheduler(app=app, schedule_filename=str(tmp_path / "s"), lazy=False)
    try:
        entry = scheduler.schedule[PURGE_ENTRY_NAME]
        assert entry.task == PURGE_TASK_NAME and entry.kwargs == {"older_than_days": 3}
        assert entry.schedule.run_every == timedelta(seconds=3600)
    finally:
        scheduler.close()
        app.conf.beat_schedule = saved


@pytest.mark.django_db(transaction=True)
def test_the_scheduled_task_deletes_finished_jobs_past_the_retention_in_batches():
    """The entry's task, run as a worker would with the entry's kwargs: finished jobs
    older than the retention go with their history; running, pending and recent stay."""
    with freeze_time("2030-01-01"):
        old = [job_in("SUCCEEDED", 1), job_in("FAILED", 2), job_in("SUCCEEDED", 3)]
        job_in("RUNNING", 4)
        job_in("PENDING", 5)
    with freeze_time("2030-01-25"):
        job_in("SUCCEEDED", 6)
    entry = purge_schedule(10, batch_size=2)[PURGE_ENTRY_NAME]
    with freeze_time("2030-01-30"):
        result = app.tasks[entry["task"]].apply(kwargs=entry["kwargs"]).get()
    assert result["job"] == 3
    assert sorted(Job.objects.values_list("key", flat=True)) == ["ship/4", "ship/5", "ship/6"]
    assert not Transition.objects.filter(job_id__in=[job.pk for job in old]).exists()
