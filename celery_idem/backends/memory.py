"""The job store in this process's memory, for tests: ``celery_idem.testing`` offers it.

It renders the same moves as the database backends (the contract tests in
tests/db/test_backend_contract.py run all three), so the state machine, fencing and
replay behave as in production; jobs and their history live in dicts of this process.
"""

from __future__ import annotations

import itertools
import operator
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q

from .. import states
from ..states import Guard, Move, State, StepWrite
from .base import Backend
from .memory_query import q_matches
from .values import (
    DUPLICATE,
    DUPLICATE_REASON,
    ROW_COLUMNS,
    Change,
    Claimant,
    ClaimOutcome,
    Intent,
    JobRow,
)


@dataclass
class HistoryLine:
    """One line of a job's history in memory (as ``celery_idem.models.Transition``)."""

    job_id: int
    event: str
    from_state: State | None
    to_state: State
    attempt: int
    worker: str = ""
    task_id: str = ""
    reason: str = ""
    actor: str = ""
    at: datetime | None = None
    attempt_started_at: datetime | None = None


@dataclass
class MemoryJob:
    """A job row in memory, with the columns of ``celery_idem.models.Job``."""

    id: int
    namespace: str
    key: str
    task_name: str
    fingerprint: str
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    state: State = State.PENDING
    attempt: int = 0
    worker: str = ""
    task_id: str = ""
    lease_expires_at: datetime | None = None
    not_before: datetime | None = None
    dispatch_count: int = 0
    message: dict[str, Any] | None = None
    expires_at: datetime | None = None
    sent_at: datetime | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    dead_lettered: bool = False
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime | None = None
    parent_id: int | None = None

    def row(self) -> JobRow:
        return JobRow.from_values({c: getattr(self, c) for c in ROW_COLUMNS})

    def matches(self, move: Move, now: datetime, *, attempt: int | None = None,
                fingerprint: str = "", task_id: str = "",
                dispatch_count: int | None = None) -> bool:
        """``move``'s guard, rendered in Python."""
        checks = {
            Guard.FENCED: lambda: self.attempt == attempt,
            Guard.SAME_ARGUMENTS: lambda: self.fingerprint == fingerprint,
            Guard.CLAIMABLE: lambda: states.claimable(self.not_before, self.task_id, now,
                                                      task_id),
            Guard.LEASE_EXPIRED: lambda: states.lease_expired(self.state,
                                                              self.lease_expires_at, now),
            Guard.SAME_DISPATCH: lambda: self.dispatch_count == dispatch_count,
        }
        return all(check() for flag, check in checks.items() if flag in move.guard)


class InMemoryBackend(Backend):
    """The job store in this process's memory (see the module docstring)."""

    #: No worker writes its heartbeat here: recovery's liveness pass (which reads the
    #: workers' rows in the database) does not run against it; leases still expire.
    watches_workers = False

    def __init__(self, alias: str = "default") -> None:
        super().__init__(alias)
        self.jobs: dict[int, MemoryJob] = {}
        self.history: list[HistoryLine] = []
        #: Step checkpoints: (job id, step) -> (value, attempt).
        self.checkpoints: dict[tuple[int, str], tuple[Any, int]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.RLock()

    # -- reading what happened (for tests) ------------------------------------------------

    def job(self, key: str, namespace: str | None = None) -> MemoryJob:
        """The job of ``key`` (in ``namespace``, if several have it)."""
        found = [j for j in self.jobs.values()
                 if j.key == key and namespace in (None, j.namespace)]
        if len(found) != 1:
            raise LookupError(f"{len(found)} jobs have key {key!r}")
        return found[0]

    def events(self, key: str) -> list[str]:
        """The events of ``key``'s history, in order."""
        job_id = self.job(key).id
        return [line.event for line in self.history if line.job_id == job_id]

    # -- rendering the moves ------------------------------------------------------------

    def _by_key(self, intent: Intent) -> MemoryJob | None:
        return next((j for j in self.jobs.values()
                     if (j.namespace, j.key) == (intent.namespace, intent.key)), None)

    def _line(self, job: MemoryJob, change: Change, attempt: int, now: datetime,
              unchanged: bool = False, started: datetime | None = None) -> None:
        # A move that changes no state records the state the job is in.
        source, target = (job.state, job.state) if unchanged else (change.from_state,
                                                                   change.to_state)
        self.history.append(HistoryLine(
            job.id, change.event, source, target, attempt, change.worker,
            change.task_id, change.reason, change.actor, now,
            started if states.move(change.event).records_start else None))

    def _insert(self, move: Move, intent: Intent, now: datetime, *, task_id: str,
                claimant: Claimant | None = None, reason: str = "") -> ClaimOutcome:
        assert move.target is not None
        with self._lock:
            existing = self._by_key(intent)
            if existing is not None:
                return ClaimOutcome(False, existing.row())
            job = MemoryJob(next(self._ids), intent.namespace, intent.key, intent.task_name,
                            intent.fingerprint, intent.args, intent.kwargs,
                            dict(intent.options), move.target, task_id=task_id,
                            created_at=now, updated_at=now, parent_id=intent.parent_id,
                            message=intent.message, not_before=intent.not_before,
                            expires_at=intent.expires_at,
                            sent_at=now if intent.sent else None)
            if claimant is not None:
                job.attempt, job.worker, job.started_at = 1, claimant.worker, now
                job.lease_expires_at = claimant.lease_expires_at
            self.jobs[job.id] = job
            if move.recorded:
                self._line(job, Change(job.id, move.event, None, worker=job.worker,
                                       task_id=task_id, reason=reason), job.attempt, now)
            return ClaimOutcome(True, job.row())

    def _commit_new(self, move: Move, intent: Intent, claimant: Claimant,
                    ended: dict[str, Any]) -> int | None:
        with self._lock:
            outcome = self._insert(move, intent, claimant.now, task_id=claimant.task_id,
                                   claimant=claimant)
            if not outcome.won or outcome.row is None:
                return None
            job = self.jobs[outcome.row.id]
            job.lease_expires_at, job.updated_at = None, ended["finished_at"]
            for column, value in ended.items():
                setattr(job, column, value)
            return job.id

    def _claim(self, move: Move, source: State, intent: Intent, claimant: Claimant,
               reason: str) -> ClaimOutcome:
        now = claimant.now
        with self._lock:
            job = self._by_key(intent)
            if job is None:
                return ClaimOutcome(False, None)
            if job.state == source and job.matches(move, now, fingerprint=intent.fingerprint,
                                                   task_id=claimant.task_id):
                started = job.started_at  # the attempt taken over's, before the claim
                job.state, job.attempt = State.RUNNING, job.attempt + 1
                job.worker, job.task_id = claimant.worker, claimant.task_id
                job.lease_expires_at, job.not_before = claimant.lease_expires_at, None
                job.started_at = job.updated_at = now
                if move.recorded:
                    self._line(job, Change(job.id, move.event, source, worker=claimant.worker,
                                           task_id=claimant.task_id, reason=reason),
                               job.attempt, now, started=started)
                return ClaimOutcome(True, job.row())
            recorded = states.move(DUPLICATE).recorded and self._apply(Change(
                job.id, DUPLICATE, job.state, attempt=job.attempt, worker=claimant.worker,
                task_id=claimant.task_id, reason=DUPLICATE_REASON,
                fingerprint=intent.fingerprint), states.move(DUPLICATE), now) is not None
            return ClaimOutcome(False, job.row(), recorded)

    def connection(self) -> Any:
        return None

    def state_of(self, job_id: int) -> tuple[State, int] | None:
        job = self.jobs.get(job_id)
        return None if job is None else (job.state, job.attempt)

    def _apply(self, change: Change, move: Move, now: datetime) -> int | None:
        with self._lock:
            job = self.jobs.get(change.job_id)
            if job is None or not job.matches(move, now, attempt=change.attempt,
                                              fingerprint=change.fingerprint,
                                              dispatch_count=change.dispatch_count):
                return None
            if move.target is None and not change.values:
                # In one of the move's sources; the line says the state the job is in.
                if job.state not in move.sources:
                    return None
                attempt = job.attempt if change.attempt is None else change.attempt
                if move.recorded:
                    self._line(job, change, attempt, now, unchanged=True)
                return attempt
            else:
                if job.state != change.from_state:
                    return None
                started = job.started_at  # as it was before the move
                for column, value in change.values.items():
                    setattr(job, column, value)
                job.state, job.updated_at = change.to_state, now
                attempt = job.attempt
                if move.recorded:
                    self._line(job, change, attempt, now, started=started)
            return attempt

    # -- step checkpoints ----------------------------------------------------------------

    def _save_step(self, change: Change, step: str, value: Any, now: datetime) -> StepWrite:
        with self._lock:
            job = self.jobs.get(change.job_id)
            if job is None or job.state != change.from_state or not job.matches(
                    change.move, now, attempt=change.attempt):
                return StepWrite.FENCED
            if (job.id, step) in self.checkpoints:
                return StepWrite.EXISTS
            self.checkpoints[job.id, step] = (value, job.attempt)
            if change.move.recorded:
                self._line(job, change, job.attempt, now)
            return StepWrite.STORED

    def read_step(self, job_id: int, step: str) -> tuple[bool, Any]:
        with self._lock:
            stored = self.checkpoints.get((job_id, step))
        return (False, None) if stored is None else (True, stored[0])

    def clear_steps(self, job_id: int) -> int:
        with self._lock:
            gone = [k for k in self.checkpoints if k[0] == job_id]
            for k in gone:
                del self.checkpoints[k]
        return len(gone)

    # -- reads ---------------------------------------------------------------------------

    @contextmanager
    def locked_batch(self, condition: Q, limit: int,
                     order: tuple[str, ...]) -> Iterator[list[Any]]:
        from ..models import Job

        with self._lock:
            rows = sorted((j for j in self.jobs.values() if q_matches(condition, j)),
                          key=operator.attrgetter(*order))
            # Unsaved model instances: recovery reads their fields and never saves them.
            yield [Job(**vars(j)) for j in rows[:limit]]

    def attempts_since_reset(self, job_id: int, attempt: int) -> int:
        resets = [line.attempt for line in self.history
                  if line.job_id == job_id and line.event == "reset"]
        return attempt - (resets[-1] if resets else 0)

    def task_names(self, limit: int) -> list[str]:
        return sorted({j.task_name for j in self.jobs.values()})[:limit]

    def task_counts(self, condition: Q) -> dict[str, int]:
        with self._lock:
            return dict(Counter(j.task_name for j in self.jobs.values()
                                if q_matches(condition, j)))
