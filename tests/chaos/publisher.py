"""The chaos run's producer: every key published two or three times, in bursts paced
over the run (some copies while the first attempt runs), and "canaries" for the Redis
restart: keys published twice right before the crash, behind a backlog, so that every
message of theirs is lost and only recovery's re-send from the stored envelope can run
them."""

from __future__ import annotations

import heapq
import math
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .servers import wait_for

KINDS = ("atomic", "charge", "count")
#: Jobs come in bursts every BURST seconds, so the queue holds a backlog for a moment.
BURST = 3.0


class Publisher:
    def __init__(self, jobs: int, duration: float, hold: float, rng: random.Random,
                 folder: Path, provider_url: str) -> None:
        from django_app.effects.chaos_tasks import chaos_atomic, chaos_charge, chaos_count

        self.tasks: dict[str, Any] = {"atomic": chaos_atomic, "charge": chaos_charge,
                                      "count": chaos_count}
        self.jobs, self.duration, self.hold, self.rng = jobs, duration, hold, rng
        self.folder, self.provider_url = folder, provider_url
        self.holds = [round(rng.uniform(0.02, hold), 3) for _ in range(jobs)]
        #: key -> kind, for every key with at least one copy sent
        self.published: dict[str, str] = {}
        self.counts: Counter[str] = Counter()
        self.log: list[str] = []
        self._next_extra = jobs
        self._lock = threading.Lock()

    def send(self, n: int, hold: float) -> str:
        """Publish one copy of job ``n``; its Celery task id."""
        kind = KINDS[n % 3]
        call = (n, str(self.folder), hold) + ((self.provider_url,) if kind == "charge" else ())
        result = self.tasks[kind].apply_async(args=call)
        with self._lock:
            self.published[f"chaos/{kind}/{n}"] = kind
            self.counts["copies sent"] += 1
        return str(result.id)

    def canaries(self, count: int = 3) -> list[tuple[str, list[str]]]:
        """``count`` new keys, each published twice now: (key, task ids)."""
        sent = []
        for _ in range(count):
            n = self._extra()
            ids = [self._send_when_possible(n, 0.05), self._send_when_possible(n, 0.05)]
            sent.append((f"chaos/{KINDS[n % 3]}/{n}", ids))
        return sent

    def target(self, kind: str) -> str:
        """A new key of ``kind``, published once now, whose attempt holds its pool child
        for a second: something for a fault to strike once the run's own jobs are done.
        Its key."""
        n = self._extra(kind)
        self._send_when_possible(n, max(self.hold, 1.0))
        return f"chaos/{kind}/{n}"

    def _send_when_possible(self, n: int, hold: float, timeout: float = 60.0) -> str:
        """``send``, tried again while the job database refuses the publish (nothing was
        sent): a fault may strike while it is still settling after a restart (behind
        PgBouncer it stays unreachable ~15 s, and this thread's session may predate it)."""
        from django.db import connections

        from celery_idem.errors import PersistenceError

        def sent() -> str | None:
            try:
                return self.send(n, hold)
            except PersistenceError:
                connections.close_all()
                return None

        return wait_for(sent, timeout, f"the job database to take job {n}", 0.5)

    def _extra(self, kind: str | None = None) -> int:
        """The number of a new job beyond the run's own (of ``kind``, if given)."""
        from django.db import connections

        # Called from the fault injector's thread, whose Django connection may predate a
        # database restart (on MariaDB the intent is written on Django's connection).
        connections.close_all()
        with self._lock:
            n = self._next_extra
            while kind is not None and KINDS[n % 3] != kind:
                n += 1
            self._next_extra = n + 1
        return n

    def run(self, progress) -> None:
        """Publish every job's copies at their moments; a publish that fails (PostgreSQL
        or the broker restarting) is tried again half a second later."""
        from django.db import connections

        due: list[tuple[float, int, int]] = []  # (when, job number, copy)
        per_burst = max(1, math.ceil(self.jobs * BURST / self.duration))
        for n in range(self.jobs):
            first = (n // per_burst) * BURST + self.rng.uniform(0, 0.2)
            copies = [first, first + self.rng.uniform(0, 2 * self.holds[n])]
            if self.rng.random() < 0.3:
                copies.append(first + self.rng.uniform(0, 10))
            for copy, when in enumerate(copies):
                heapq.heappush(due, (when, n, copy))
        start = last_status = time.monotonic()
        while due:
            when, n, copy = heapq.heappop(due)
            wait = start + when - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # pacing the load, not synchronisation
            try:
                self.send(n, self.holds[n])
            except Exception as exc:
                self.counts["publish errors"] += 1
                self.log.append(f"publish {n}: {type(exc).__name__}: {exc}"[:300])
                connections.close_all()
                heapq.heappush(due, (time.monotonic() - start + 0.5, n, copy))
                continue
            if time.monotonic() - last_status > 10:
                last_status = time.monotonic()
                progress(time.monotonic() - start)
