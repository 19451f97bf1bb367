"""The beat schedule entry for the recovery task: one line in a project's settings.

    from celery_idem.beat import recovery_schedule

    CELERY_BEAT_SCHEDULE = {**recovery_schedule(), ...}

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
DEFAULT_INTERVAL = 60


def recovery_schedule(interval: float = DEFAULT_INTERVAL, *, queue: str | None = None,
                      name: str = ENTRY_NAME) -> dict[str, dict[str, Any]]:
    """``{name: entry}`` running one recovery pass every ``interval`` seconds.

    A pass that no worker starts within the interval expires instead of piling up behind
    the next one (passes are safe to overlap, but useless to queue). ``queue`` routes the
    pass to a queue of its own, so a backlog of work does not delay recovery.
    """
    if interval < 1:
        raise ValueError(f"the recovery interval must be at least 1 second, not {interval!r}")
    seconds = int(interval) if float(interval).is_integer() else float(interval)
    options: dict[str, Any] = {
        "expires": seconds,  # read by Celery's default scheduler (apply_async option)
        # django-celery-beat keeps only the options it has columns for, and stores the
        # expiry as expire_seconds; Celery's scheduler passes it on as an unused property.
        "expire_seconds": int(interval),
    }
    if queue:
        options["queue"] = queue
    return {name: {"task": TASK_NAME, "schedule": timedelta(seconds=seconds),
                   "options": options}}
