"""Which workers a recovery pass presumes dead: those silent for the worker timeout.

A worker writes its heartbeat row every ``CELERY_IDEM_WORKER_HEARTBEAT`` seconds
(``celery_idem.liveness``). A worker whose last beat is older than
``CELERY_IDEM_WORKER_TIMEOUT`` stopped: the pass hands back its claims (``recovery.sweep``,
by the rule of ``recovery.handback``) and then forgets its row.

A missed beat is not death. When the database is down, workers cannot beat and recovery
cannot run; right after it comes back, every worker's last beat is as old as the outage,
and a pass that ran before their next beat would take the claims of live workers. So a
pass presumes a worker dead only if recovery has itself been watching for the whole
timeout: it keeps a row of its own (``OBSERVER``), whose ``beat_at`` is the last pass and
``started_at`` since when passes have followed each other with no gap longer than the
timeout less one heartbeat interval (a gap that long may hide an outage the workers could
not beat through). After an outage, or a pass with a moved clock, the watch starts again
and liveness waits one timeout more; the lease still ends every claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core import checks
from django.db.models import Q

from ..check_ids import CHECKS
from ..conf import settings
from ..errors import ConfigurationError
from ..heartbeat_model import WorkerHeartbeat
from ..states import State

#: The worker name of recovery's own row. A worker's name has a ``#`` (liveness.worker_name).
OBSERVER = "celery-idem recovery"


@dataclass(frozen=True)
class DeadWorker:
    """A worker presumed dead: its name and its last beat."""

    worker: str
    beat_at: datetime

    def claims(self) -> Q:
        """Its claims (RUNNING, with a lease: a replaced body's claim names no worker)."""
        return Q(state=State.RUNNING, lease_expires_at__isnull=False,
                 worker__startswith=f"{self.worker}/")

    def why(self, timeout: float) -> str:
        return (f"worker stopped beating: {self.worker} last proved alive at "
                f"{self.beat_at:%Y-%m-%d %H:%M:%S%z}, more than {timeout:g}s before "
                "(CELERY_IDEM_WORKER_TIMEOUT)")


def enabled() -> bool:
    return settings.WORKER_HEARTBEAT is not None and settings.WORKER_TIMEOUT is not None


def watched_since(alias: str, now: datetime) -> datetime:
    """Record this pass in the observer row; return since when recovery has watched."""
    rows = WorkerHeartbeat.objects.using(alias)
    gap = timedelta(seconds=float(settings.WORKER_TIMEOUT) - float(settings.WORKER_HEARTBEAT))
    last = rows.filter(worker=OBSERVER).values_list("started_at", "beat_at").first()
    since = last[0] if last and timedelta(0) <= now - last[1] <= gap else now
    if not rows.filter(worker=OBSERVER).update(started_at=since, beat_at=now):
        rows.get_or_create(worker=OBSERVER, defaults={"hostname": "", "started_at": since,
                                                      "beat_at": now})
    return since


def dead_workers(alias: str, now: datetime) -> list[DeadWorker]:
    """The workers silent for longer than the timeout while recovery watched, oldest first."""
    if not enabled():
        return []
    cutoff = now - timedelta(seconds=float(settings.WORKER_TIMEOUT))
    if watched_since(alias, now) > cutoff:
        return []
    silent = (WorkerHeartbeat.objects.using(alias).filter(beat_at__lt=cutoff)
              .exclude(worker=OBSERVER).order_by("beat_at").values_list("worker", "beat_at"))
    return [DeadWorker(worker, beat_at) for worker, beat_at in silent]


def forget(alias: str, dead: DeadWorker) -> bool:
    """Delete the row of ``dead`` once it holds no claim (the pass leaves those of a task
    it does not know) and has not beaten since."""
    from ..models import Job

    if Job.objects.using(alias).filter(dead.claims()).exists():
        return False
    rows = WorkerHeartbeat.objects.using(alias)
    return bool(rows.filter(worker=dead.worker, beat_at=dead.beat_at).delete()[0])


# -- the system checks (celery_idem.checks) ----------------------------------------------

#: Seconds within which the default settings hand a dead worker's claims back.
PROMISE = 60


def recovery_interval(beat_schedule: Any) -> float | None:
    """Seconds between the recovery passes ``beat_schedule`` runs (the shortest, if it
    has several), or None: not scheduled there, or not at a fixed interval (crontab)."""
    from ..beat import TASK_NAME

    intervals = []
    for entry in (beat_schedule or {}).values():
        if not isinstance(entry, dict) or entry.get("task") != TASK_NAME:
            continue
        every = getattr(entry.get("schedule"), "run_every", entry.get("schedule"))
        if isinstance(every, timedelta):
            intervals.append(every.total_seconds())
        elif isinstance(every, int | float) and not isinstance(every, bool):
            intervals.append(float(every))
    return min(intervals, default=None)


def check(conf: Any) -> list[checks.CheckMessage]:
    """E040: a timeout too short for the heartbeat; W040: recovery passes too far apart
    to watch a worker for the timeout; W041: a dead worker's claims may wait longer than
    ``PROMISE`` seconds (the timeout plus the interval between passes)."""
    try:
        heartbeat, timeout = float(settings.WORKER_HEARTBEAT), float(settings.WORKER_TIMEOUT)
    except (TypeError, ConfigurationError):
        return []  # off (None), or not valid: the settings' own check (E012) says so
    if timeout <= 2 * heartbeat:
        return [CHECKS["E040"](
            f"CELERY_IDEM_WORKER_TIMEOUT ({timeout:g}s) is not more than twice "
            f"CELERY_IDEM_WORKER_HEARTBEAT ({heartbeat:g}s): one late beat would make a "
            "live worker look dead")]
    interval = recovery_interval(conf.beat_schedule)
    if interval is None:
        return []
    if interval >= timeout - heartbeat:
        return [CHECKS["W040"](
            f"the recovery pass runs every {interval:g}s, which is not less than "
            f"CELERY_IDEM_WORKER_TIMEOUT less one heartbeat ({timeout - heartbeat:g}s): "
            "recovery never watches the workers long enough to presume one dead, and a dead "
            "worker's claims wait for their lease")]
    if timeout + interval > PROMISE:
        return [CHECKS["W041"](
            f"a dead worker's claims may wait {timeout + interval:g}s: "
            f"CELERY_IDEM_WORKER_TIMEOUT ({timeout:g}s) plus the interval between recovery "
            f"passes ({interval:g}s), more than {PROMISE}s")]
    return []
