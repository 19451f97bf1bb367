"""The signal receivers behind the counters: each transition adds to what
``definitions.COUNTED`` says, in memory, on the hot path (no query, no I/O).

A ``Sink`` is where the numbers go: Prometheus's client (``metrics.prometheus``) or
OpenTelemetry's API (``metrics.otel``). The recorder knows neither.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Protocol

from .definitions import CLAIM_TO_COMMIT, ENDS, STARTS, WAITED, Metric, counted

#: The label of a task name past the limit (``CELERY_IDEM_METRICS_MAX_TASKS``), and of a
#: transition whose writer did not know its task.
OTHER, UNKNOWN = "other", "unknown"
#: Claims whose commit this process still waits for, at most (a claim whose worker was
#: lost never commits here: the oldest go first).
OPEN_CLAIMS = 10_000


class Sink(Protocol):
    def add(self, metric: Metric, labels: dict[str, str]) -> None: ...

    def observe(self, metric: Metric, labels: dict[str, str], value: float) -> None: ...


class TaskLabels:
    """Task names as label values, at most ``limit`` distinct ones per process (a label
    per name is a time series per name: unbounded names would be unbounded series)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, name: str) -> str:
        if not name:
            return UNKNOWN
        if name in self._seen:
            return name
        with self._lock:
            if len(self._seen) < self.limit:
                self._seen.add(name)
                return name
        return OTHER


class Recorder:
    """Receives ``signals.transition`` and ``signals.duplicate_waiting`` for its sinks."""

    def __init__(self, sinks: list[Sink], max_tasks: int) -> None:
        self.sinks = sinks
        self.task = TaskLabels(max_tasks)
        #: (job id, attempt) -> the claim's ``clock``, until its commit.
        self._claims: OrderedDict[tuple[int, int], float] = OrderedDict()
        self._lock = threading.Lock()

    def on_transition(self, sender: Any = None, *, event: str, from_state: str | None,
                      job_id: int, attempt: int, task_name: str = "", clock: float = 0.0,
                      **_: Any) -> None:
        task = self.task(task_name)
        for metric, labels in counted(event, from_state):
            self._add(metric, {"task": task, **labels})
        if event in STARTS:
            self._started((job_id, attempt), clock)
        elif event in ENDS:
            with self._lock:
                started = self._claims.pop((job_id, attempt), None)
            if started is not None:
                self._observe(task, ENDS[event], max(0.0, clock - started))

    def on_waiting(self, sender: Any = None, *, task_name: str = "", **_: Any) -> None:
        metric, labels = WAITED
        self._add(metric, {"task": self.task(task_name), **labels})

    def _started(self, claim: tuple[int, int], clock: float) -> None:
        with self._lock:
            self._claims[claim] = clock
            while len(self._claims) > OPEN_CLAIMS:
                self._claims.popitem(last=False)

    def _add(self, metric: Metric, labels: dict[str, str]) -> None:
        for sink in self.sinks:
            sink.add(metric, labels)

    def _observe(self, task: str, outcome: str, seconds: float) -> None:
        for sink in self.sinks:
            sink.observe(CLAIM_TO_COMMIT, {"task": task, "outcome": outcome}, seconds)
