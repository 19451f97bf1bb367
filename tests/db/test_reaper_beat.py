"""The beat schedule helper: one entry that both Celery schedulers accept as written."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery.beat import PersistentScheduler

from celery_idem.beat import ENTRY_NAME, TASK_NAME, recovery_schedule
from django_app.celery import app


def test_the_entry_names_the_task_its_interval_and_expiry():
    """recovery_schedule() returns {name: entry} with the interval and a matching expiry."""
    entry = recovery_schedule(30, queue="recovery")[ENTRY_NAME]
    assert entry == {"task": TASK_NAME, "schedule": timedelta(seconds=30),
                     "options": {"expires": 30, "expire_seconds": 30, "queue": "recovery"}}


def test_an_interval_below_one_second_is_refused():
    """A zero or negative interval is a configuration error, raised at settings time."""
    with pytest.raises(ValueError, match="at least 1 second"):
        recovery_schedule(0)


@pytest.fixture
def beat_schedule():
    """Set the app's beat_schedule for one test, as CELERY_BEAT_SCHEDULE would."""
    saved = app.conf.beat_schedule

    def use(schedule):
        app.conf.beat_schedule = schedule

    yield use
    app.conf.beat_schedule = saved


def test_celerys_default_scheduler_merges_the_entry(tmp_path, beat_schedule):
    """PersistentScheduler reads beat_schedule at start: the entry is there, due each 60 s."""
    beat_schedule(recovery_schedule(60))
    scheduler = PersistentScheduler(app=app, schedule_filename=str(tmp_path / "s"), lazy=False)
    try:
        entry = scheduler.schedule[ENTRY_NAME]
        assert entry.task == TASK_NAME and entry.schedule.run_every == timedelta(seconds=60)
        assert entry.options["expires"] == 60
    finally:
        scheduler.close()


# The scheduler closes old connections itself, which a test transaction cannot survive.
@pytest.mark.django_db(transaction=True)
def test_django_celery_beat_copies_the_entry_into_its_table(beat_schedule):
    """DatabaseScheduler upserts the entry as a PeriodicTask at start, with the expiry."""
    pytest.importorskip("django_celery_beat", reason="django-celery-beat is not installed")
    from django_celery_beat.models import PeriodicTask
    from django_celery_beat.schedulers import DatabaseScheduler

    beat_schedule(recovery_schedule(45))
    scheduler = DatabaseScheduler(app=app, lazy=False)
    row = PeriodicTask.objects.get(name=ENTRY_NAME)
    assert (row.task, row.interval.every, row.interval.period, row.expire_seconds) == \
        (TASK_NAME, 45, "seconds", 45)
    assert scheduler.schedule[ENTRY_NAME].options["expires"] == 45
