"""The beat schedule entries for the recovery and retention tasks: a line in settings.

    from celery_idem.beat import purge_schedule, recovery_schedule

    CELERY_BEAT_SCHEDULE = {**recovery_schedule(), **purge_schedule(), ...}

It works with Celery's default scheduler and with django-celery-beat's
``DatabaseScheduler``, which copies every ``beat_schedule`` entry into its PeriodicTask
table, by name, each time beat starts: an admin edit of that row is overwritten at the
next start, so change the interval here. Safe to import from a settings module (nothing
here reads Django settings).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

#: The recovery task's registered name (celery_idem.tasks.RELEASE_STALE_CLAIMS).
TASK_NAME = "celery_idem.release_stale_claims"
#: The entry's name in beat_schedule, and the PeriodicTask name under django-celery-beat.
ENTRY_NAME = "celery-idem-recovery"
#: Every 10 s: with CELERY_IDEM_WORKER_TIMEOUT's 40 s, a dead worker's claims are handed
#: back within 50 s of its last beat, and two lost passes in a row do not restart
#: recovery's watch (celery_idem.recovery.liveness). A pass with nothing to do reads a few
#: index ranges (18 ms at 10M jobs, docs/how-to/large-tables.md).
DEFAULT_INTERVAL = 10
#: The retention task's registered name (celery_idem.tasks.PURGE_FINISHED_JOBS).
PURGE_TASK_NAME = "celery_idem.purge_finished_jobs"
PURGE_ENTRY_NAME = "celery-idem-purge"
#: Hourly: each run deletes the hour's worth of jobs that passed the retention (at a
#: few hundred tasks a second, about a million), in short batches.
DEFAULT_PURGE_INTERVAL = 3600


def _entry(task: str, interval: float, queue: str | None,
           kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """A schedule entry whose run expires when the next is due: a run that no worker
    starts within the interval is dropped instead of piling up behind the next one."""
    if interval < 1:
        raise ValueError(f"the interval must be at least 1 second, not {interval!r}")
    seconds = int(interval) if float(interval).is_integer() else float(interval)
    options: dict[str, Any] = {
        "expires": seconds,  # read by Celery's default scheduler (apply_async option)
        # django-celery-beat keeps only the options it has columns for, and stores the
        # expiry as expire_seconds; Celery's scheduler passes it on as an unused property.
        "expire_seconds": int(interval),
    }
    if queue:
        options["queue"] = queue
    entry = {"task": task, "schedule": timedelta(seconds=seconds), "options": options}
    if kwargs:
        entry["kwargs"] = kwargs
    return entry


def recovery_schedule(interval: float = DEFAULT_INTERVAL, *, queue: str | None = None,
                      name: str = ENTRY_NAME) -> dict[str, dict[str, Any]]:
    """``{name: entry}`` running one recovery pass every ``interval`` seconds.

    A pass that no worker starts within the interval expires instead of piling up behind
    the next one (passes are safe to overlap, but useless to queue). ``queue`` routes the
    pass to a queue of its own, so a backlog of work does not delay recovery.
    """
    return {name: _entry(TASK_NAME, interval, queue)}


def purge_schedule(older_than: float | None = None, interval: float = DEFAULT_PURGE_INTERVAL,
                   *, queue: str | None = None, batch_size: int | None = None,
                   name: str = PURGE_ENTRY_NAME) -> dict[str, dict[str, Any]]:
    """``{name: entry}`` deleting, every ``interval`` seconds, the jobs finished more than
    ``older_than`` days ago (default CELERY_IDEM_RETENTION_DAYS, read by the task when
    it runs), as ``idem_purge`` does: by id, in short batches. ``queue`` keeps it off
    the queues of the project's work."""
    if older_than is not None and older_than <= 0:
        raise ValueError(f"the retention must be more than 0 days, not {older_than!r}")
    kwargs: dict[str, Any] = {}
    if older_than is not None:
        kwargs["older_than_days"] = older_than
    if batch_size is not None:
        kwargs["batch_size"] = batch_size
    return {name: _entry(PURGE_TASK_NAME, interval, queue, kwargs)}
