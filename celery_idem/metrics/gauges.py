"""The gauges' values, read from the job database when a scrape asks, kept for
``CELERY_IDEM_METRICS_CACHE_SECONDS`` so a scrape every few seconds (or several
exporters) costs the database one reading per period.

Each reading is cheap at millions of rows: jobs per task and state from
``census.job_counts`` (exact from a small partial index, SUCCEEDED estimated from the
planner's statistics on PostgreSQL), with the running atomic jobs, whose rows read
PENDING until their body commits, counted RUNNING (``census.running_atomic``); the
oldest stale claim from the partial index on RUNNING leases; the oldest never-sent
intent among PENDING rows only. A reading that fails (the database is down) keeps the
last values and reports ``celery_idem_gauges_up`` 0; it never fails the scrape of the
counters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import DatabaseError, connections
from django.db.models import Min
from django.utils import timezone

from ..conf import settings
from ..states import State, never_sent_q, stale_q
from .recorder import OTHER

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reading:
    """One reading of the gauges. ``jobs``: (task, state) -> jobs."""

    jobs: dict[tuple[str, str], int] = field(default_factory=dict)
    oldest_stale_claim: float = 0.0
    oldest_never_sent: float = 0.0
    up: bool = False


class Gauges:
    """The latest reading, renewed at most once per ``ttl`` seconds (default the
    setting). ``reader``: how a reading is made (default ``read``, from the database)."""

    def __init__(self, ttl: float | None = None,
                 reader: Callable[[str, datetime, int], Reading] | None = None) -> None:
        self.ttl = ttl
        self.reader = reader or read
        self._reading = Reading()
        self._at: float | None = None
        self._lock = threading.Lock()

    def read(self) -> Reading:
        ttl = float(settings.METRICS_CACHE_SECONDS if self.ttl is None else self.ttl)
        with self._lock:  # one scrape reads, the others wait for its values
            if self._at is None or time.monotonic() - self._at >= ttl:
                self._reading = self._fresh()
                self._at = time.monotonic()
            return self._reading

    def _fresh(self) -> Reading:
        alias = settings.DATABASE
        connection = connections[alias]
        opened = connection.connection is None
        try:
            return self.reader(alias, timezone.now(), int(settings.METRICS_MAX_TASKS))
        except DatabaseError:
            logger.warning("celery-idem metrics: the gauges could not be read", exc_info=True)
            return Reading(self._reading.jobs, self._reading.oldest_stale_claim,
                           self._reading.oldest_never_sent, up=False)
        finally:
            # An exporter's thread opened a connection of its own: close it rather than
            # leave one per scrape thread. A caller's own connection stays as it was.
            if opened and not connection.in_atomic_block:
                connection.close()


def read(alias: str, now: datetime, max_tasks: int) -> Reading:
    """The gauges' values on database ``alias`` at ``now``."""
    from ..census import job_counts, running_atomic, with_running_atomic
    from ..models import Job

    jobs = Job.objects.using(alias)
    stale = jobs.filter(stale_q(now)).aggregate(at=Min("lease_expires_at"))["at"]
    unsent = jobs.filter(never_sent_q(), state=State.PENDING).aggregate(
        at=Min("created_at"))["at"]
    counts: Counter[tuple[str, str]] = Counter()
    named: set[str] = set()
    # A running atomic job's row reads PENDING until its body commits: counted RUNNING.
    for row in with_running_atomic(job_counts(using=alias), running_atomic(using=alias)):
        if row.task_name not in named and len(named) < max_tasks:
            named.add(row.task_name)
        counts[(row.task_name if row.task_name in named else OTHER, row.state)] += row.count
    return Reading(dict(counts), _age(now, stale), _age(now, unsent), up=True)


def _age(now: datetime, since: datetime | None) -> float:
    return max(0.0, (now - since).total_seconds()) if since is not None else 0.0
