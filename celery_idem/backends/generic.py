"""The portable backend: the same protocol steps through the ORM, for SQLite and MySQL/MariaDB.

Each step runs in ``transaction.atomic`` and starts with its conditional UPDATE, so on
SQLite the transaction takes the write lock first (and waits for it) rather than
upgrading a read lock, which fails at once when another writer got in between.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F, Q

from .. import states
from ..models import Job, Transition
from ..signals import announce
from ..states import State
from .base import (
    ROW_COLUMNS,
    BatchMove,
    Claimant,
    ClaimOutcome,
    Intent,
    JobRow,
    checked_target,
    claim_reason,
)


def _as_row(job: Job) -> JobRow:
    return JobRow.from_values({col: getattr(job, col) for col in ROW_COLUMNS})


class GenericBackend:
    """Backend for any database Django supports."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def _jobs(self) -> Any:
        return Job.objects.using(self.alias)

    def _row(self, namespace: str, key: str) -> JobRow | None:
        values = self._jobs().filter(namespace=namespace, key=key).values(*ROW_COLUMNS).first()
        return JobRow.from_values(values) if values else None

    def _history(self, job_id: int, event: str, from_state: State | None, to_state: State,
                 attempt: int, now: datetime, **fields: str) -> None:
        Transition.objects.using(self.alias).create(
            job_id=job_id, event=event, from_state=from_state, to_state=to_state,
            attempt=attempt, at=now, **fields,
        )
        announce(self.alias, job_id, event, from_state, to_state, attempt, **fields)

    def publish(self, intent: Intent, task_id: str, now: datetime) -> ClaimOutcome:
        try:
            with transaction.atomic(using=self.alias):
                job = self._jobs().create(
                    namespace=intent.namespace, key=intent.key, task_name=intent.task_name,
                    args=intent.args, kwargs=intent.kwargs, fingerprint=intent.fingerprint,
                    options=intent.options, task_id=task_id, created_at=now, updated_at=now,
                )
                self._history(job.pk, "published", None, State.PENDING, 0, now, task_id=task_id)
        except IntegrityError:
            return ClaimOutcome(False, self._row(intent.namespace, intent.key))
        return ClaimOutcome(True, _as_row(job))

    def claim(self, intent: Intent, claimant: Claimant) -> ClaimOutcome:
        with transaction.atomic(using=self.alias):
            claimed = self._claim(intent, claimant, "claimed", State.PENDING)
            if claimed:
                return ClaimOutcome(True, claimed)
            row = self._row(intent.namespace, intent.key)
            if row is None:
                return self._claim_new(intent, claimant)
            if (row.state is State.RUNNING and row.fingerprint == intent.fingerprint
                    and row.lease_expires_at is not None
                    and row.lease_expires_at < claimant.now):
                claimed = self._claim(intent, claimant, "taken_over", State.RUNNING)
                if claimed:
                    return ClaimOutcome(True, claimed)
            if row.state in states.FINISHED and row.fingerprint == intent.fingerprint:
                self._history(row.id, "duplicate", row.state, row.state, row.attempt,
                              claimant.now, worker=claimant.worker, task_id=claimant.task_id,
                              reason="replayed the stored outcome")
            return ClaimOutcome(False, row)

    def _claim(self, intent: Intent, claimant: Claimant, event: str,
               from_state: State) -> JobRow | None:
        """The conditional UPDATE of a claim; the claimed row, or None if it did not match."""
        states.check(from_state, State.RUNNING)
        now = claimant.now
        guard = Q(namespace=intent.namespace, key=intent.key, fingerprint=intent.fingerprint,
                  state=from_state)
        guard &= Q(not_before__isnull=True) | Q(not_before__lte=now) | Q(task_id=claimant.task_id)
        if from_state is State.RUNNING:
            guard &= Q(lease_expires_at__lt=now)
        matched = self._jobs().filter(guard).update(
            state=State.RUNNING, attempt=F("attempt") + 1, worker=claimant.worker,
            task_id=claimant.task_id, lease_expires_at=claimant.lease_expires_at,
            not_before=None, started_at=now, updated_at=now,
        )
        if not matched:
            return None
        row = self._row(intent.namespace, intent.key)
        assert row is not None
        reason = claim_reason(event)
        self._history(row.id, event, from_state, State.RUNNING, row.attempt, now,
                      worker=claimant.worker, task_id=claimant.task_id, reason=reason)
        return row

    def _claim_new(self, intent: Intent, claimant: Claimant) -> ClaimOutcome:
        now = claimant.now
        try:
            with transaction.atomic(using=self.alias):
                job = self._jobs().create(
                    namespace=intent.namespace, key=intent.key, task_name=intent.task_name,
                    args=intent.args, kwargs=intent.kwargs, fingerprint=intent.fingerprint,
                    options=intent.options, state=State.RUNNING, attempt=1,
                    worker=claimant.worker, task_id=claimant.task_id,
                    lease_expires_at=claimant.lease_expires_at, created_at=now,
                    started_at=now, updated_at=now,
                )
                self._history(job.pk, "claimed", None, State.RUNNING, 1, now,
                              worker=claimant.worker, task_id=claimant.task_id,
                              reason="no intent was published")
        except IntegrityError:
            return ClaimOutcome(False, self._row(intent.namespace, intent.key))
        return ClaimOutcome(True, _as_row(job))

    def transition(
        self, job_id: int, event: str, from_state: State, *, attempt: int | None,
        values: dict[str, Any], now: datetime, worker: str = "", task_id: str = "",
        reason: str = "", actor: str = "",
    ) -> bool:
        target = checked_target(event, from_state, values)
        guard = Q(id=job_id, state=from_state)
        if attempt is not None:
            guard &= Q(attempt=attempt)
        with transaction.atomic(using=self.alias):
            if not self._jobs().filter(guard).update(state=target, updated_at=now, **values):
                return False
            if attempt is None:
                attempt = self._jobs().filter(id=job_id).values_list("attempt", flat=True).get()
            self._history(job_id, event, from_state, target, attempt, now, worker=worker,
                          task_id=task_id, reason=reason, actor=actor)
        return True

    def record(
        self, job_id: int, event: str, state: State, attempt: int, *, now: datetime,
        worker: str = "", task_id: str = "", reason: str = "",
    ) -> None:
        assert states.move(event).target is None
        self._history(job_id, event, state, state, attempt, now, worker=worker,
                      task_id=task_id, reason=reason)

    def heartbeat(self, job_id: int, attempt: int, lease_expires_at: datetime,
                  now: datetime) -> bool:
        return bool(self._jobs().filter(id=job_id, state=State.RUNNING, attempt=attempt)
                    .update(lease_expires_at=lease_expires_at, updated_at=now))

    # -- recovery ----------------------------------------------------------------------

    @contextmanager
    def locked_batch(self, condition: Q, after_id: int, limit: int) -> Iterator[list[Job]]:
        features = connections[self.alias].features
        with transaction.atomic(using=self.alias):
            jobs = self._jobs().filter(condition, id__gt=after_id).order_by("id")
            if features.has_select_for_update_skip_locked:  # MySQL 8, MariaDB 10.6
                jobs = jobs.select_for_update(skip_locked=True)
            elif features.has_select_for_update:  # older MariaDB: wait for the other pass
                jobs = jobs.select_for_update()
            else:
                # SQLite has no row locks and silently ignores FOR UPDATE. An UPDATE that
                # matches nothing takes the database's write lock now, so a concurrent
                # pass waits for this batch to commit and then sees its writes, instead
                # of both acting on the same rows.
                self._jobs().filter(id=-1).update(updated_at=F("updated_at"))
            yield list(jobs[:limit])

    def transition_batch(self, moves: list[BatchMove], now: datetime) -> set[int]:
        return {
            m.job_id for m in moves
            if self.transition(m.job_id, m.event, m.from_state, attempt=m.attempt,
                               values=m.values, now=now, worker=m.worker, task_id=m.task_id,
                               reason=m.reason)
        }

    def mark_redispatched(self, job_id: int, attempt: int, dispatch_count: int, *,
                          task_id: str, now: datetime, reason: str) -> bool:
        with transaction.atomic(using=self.alias):
            matched = self._jobs().filter(
                id=job_id, state=State.PENDING, attempt=attempt, dispatch_count=dispatch_count,
            ).update(dispatch_count=dispatch_count + 1, task_id=task_id, updated_at=now)
            if not matched:
                return False
            self._history(job_id, "redispatched", State.PENDING, State.PENDING, attempt, now,
                          task_id=task_id, reason=reason)
        return True

    def task_names(self, limit: int) -> list[str]:
        return list(self._jobs().order_by("task_name").values_list("task_name", flat=True)
                    .distinct()[:limit])
