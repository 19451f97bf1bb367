"""The portable backend: the moves rendered through the ORM, for SQLite and MySQL/MariaDB.

A move that writes one statement and records no history (the hot path's intent, claim
and commit) sends that statement alone, in its own transaction or in the caller's: on
MySQL/MariaDB ``transaction.atomic`` costs three more round trips (``SET autocommit``
twice and the COMMIT), more than the statement itself. A write of several statements
runs in ``transaction.atomic`` and starts with its conditional UPDATE, so on SQLite the
transaction takes the write lock first (and waits for it) rather than upgrading a read
lock, which fails at once when another writer got in between.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F, Q, Subquery

from .. import states
from ..models import Checkpoint, Job, Transition
from ..states import Move, State, StepWrite
from .base import Backend
from .values import (
    DUPLICATE,
    DUPLICATE_REASON,
    ROW_COLUMNS,
    Change,
    Claimant,
    ClaimOutcome,
    Intent,
    JobRow,
    holds,
)


def _guard(change: Change, now: datetime) -> Q:
    """The row conditions of ``change``'s move (``states.guard_q``), with its values."""
    return states.guard_q(change.move, now=now, attempt=change.attempt,
                          fingerprint=change.fingerprint, dispatch_count=change.dispatch_count)


def _write(change: Change) -> tuple[Any, ...]:
    """What a change writes and is guarded by, whatever its job."""
    return (change.event, change.from_state, change.attempt, change.fingerprint,
            change.dispatch_count, change.values)


def _columns(move: Move, intent: Intent, now: datetime, task_id: str) -> dict[str, Any]:
    """The columns of ``intent``'s new row in ``move.target``."""
    return {"namespace": intent.namespace, "key": intent.key, "task_name": intent.task_name,
            "args": intent.args, "kwargs": intent.kwargs, "fingerprint": intent.fingerprint,
            "options": intent.options, "state": move.target, "task_id": task_id,
            "parent_id": intent.parent_id, "message": intent.message,
            "not_before": intent.not_before, "expires_at": intent.expires_at,
            "sent_at": now if intent.sent else None, "created_at": now, "updated_at": now}


def keys_by_namespace(intents: list[tuple[Intent, str]]) -> dict[str, dict[str, str]]:
    """A batch's keys per namespace, each with its publish's task id."""
    batch: dict[str, dict[str, str]] = {}
    for intent, task_id in intents:
        batch.setdefault(intent.namespace, {})[intent.key] = task_id
    return batch


def read_back(row: JobRow, created_at: datetime | None, now: datetime,
              task_id: str) -> ClaimOutcome:
    """A batch's row as read after its INSERT: won if this batch inserted it, which is
    when it carries the publish's task id and the batch's ``now`` as created_at."""
    return ClaimOutcome(created_at == now and row.task_id == task_id, row)


class GenericBackend(Backend):
    """Backend for any database Django supports."""

    def _jobs(self) -> Any:
        return Job.objects.using(self.alias)

    def _row(self, **lookup: Any) -> JobRow | None:
        values = self._jobs().filter(**lookup).values(*ROW_COLUMNS).first()
        return JobRow.from_values(values) if values else None

    def _history(self, job_id: int, change: Change, to_state: State, attempt: int,
                 now: datetime, from_state: State | None = None, started: Any = None) -> None:
        """Append the line; ``started``: the start of the attempt the move ended (a value,
        or an expression the INSERT reads)."""
        Transition.objects.using(self.alias).create(
            job_id=job_id, event=change.event, from_state=from_state or change.from_state,
            to_state=to_state, attempt=attempt, worker=change.worker,
            task_id=change.task_id, reason=change.reason, actor=change.actor, at=now,
            attempt_started_at=started,
        )

    def _start_before_claim(self, **key: Any) -> datetime | None:
        """The row's started_at before a claim rewrites it, read under the row's lock
        (SQLite: the database's write lock), so the claim's UPDATE then writes the row
        read here and no other claim can come in between."""
        self._take_write_lock()
        found: datetime | None = self._jobs().filter(**key).select_for_update().values_list(
            "started_at", flat=True).first()
        return found

    def _insert(self, move: Move, intent: Intent, now: datetime, *, task_id: str,
                claimant: Claimant | None = None, reason: str = "") -> ClaimOutcome:
        assert move.target is not None
        claim: dict[str, Any] = {}
        if claimant is not None:
            claim = {"attempt": 1, "worker": claimant.worker,
                     "lease_expires_at": claimant.lease_expires_at, "started_at": now}
        # Outside a transaction an INSERT with no history line is a transaction of its
        # own, which a conflict fails alone; in the caller's, a savepoint keeps the
        # caller's transaction usable after the conflict.
        alone = not move.recorded and connections[self.alias].get_autocommit()
        try:
            with nullcontext() if alone else transaction.atomic(using=self.alias):
                job = self._jobs().create(**_columns(move, intent, now, task_id), **claim)
                if move.recorded:
                    line = Change(job.pk, move.event, None, worker=claim.get("worker", ""),
                                  task_id=task_id, reason=reason)
                    self._history(job.pk, line, move.target, job.attempt, now)
        except IntegrityError:
            return ClaimOutcome(False, self._row(namespace=intent.namespace, key=intent.key))
        return ClaimOutcome(True, JobRow.from_values({c: getattr(job, c) for c in ROW_COLUMNS}))

    def _commit_new(self, move: Move, intent: Intent, claimant: Claimant,
                    ended: dict[str, Any]) -> int | None:
        # No savepoint: the caller rolls its transaction back when the key exists.
        try:
            job = self._jobs().create(**{
                **_columns(move, intent, claimant.now, claimant.task_id), "attempt": 1,
                "worker": claimant.worker, "started_at": claimant.now, **ended,
                "updated_at": ended["finished_at"]})
        except IntegrityError:
            return None
        return int(job.pk)

    def _insert_many(self, move: Move, intents: list[tuple[Intent, str]],
                     now: datetime) -> dict[tuple[str, str], ClaimOutcome]:
        # One multi-row INSERT whose conflicts on (namespace, key) change nothing: a no-op
        # update of the key's own namespace, not ignore_conflicts (INSERT IGNORE / INSERT
        # OR IGNORE would also drop a row that breaks any other constraint, silently).
        # Then one read of the batch's keys (``read_back``).
        features = connections[self.alias].features
        target = ["namespace", "key"] if features.supports_update_conflicts_with_target else None
        jobs = [Job(**_columns(move, intent, now, task_id)) for intent, task_id in intents]
        batch = keys_by_namespace(intents)
        found = Q()
        for namespace, keys in batch.items():
            found |= Q(namespace=namespace, key__in=list(keys))
        with transaction.atomic(using=self.alias):
            self._jobs().bulk_create(jobs, update_conflicts=True, update_fields=["namespace"],
                                     unique_fields=target)
            rows = self._jobs().filter(found).values(
                "namespace", "key", "created_at", *ROW_COLUMNS)
            outcomes = {}
            for values in rows:
                namespace, key = values.pop("namespace"), values.pop("key")
                created_at = values.pop("created_at")
                outcomes[namespace, key] = read_back(JobRow.from_values(values), created_at,
                                                     now, batch[namespace][key])
            if move.recorded:
                Transition.objects.using(self.alias).bulk_create(
                    Transition(job_id=o.row.id, event=move.event, to_state=move.target,
                               attempt=0, task_id=o.row.task_id, at=now)
                    for o in outcomes.values() if o.won and o.row is not None)
        return outcomes

    def _claim(self, move: Move, source: State, intent: Intent, claimant: Claimant,
               reason: str) -> ClaimOutcome:
        now = claimant.now
        key = {"namespace": intent.namespace, "key": intent.key}
        guard = states.guard_q(move, now=now, fingerprint=intent.fingerprint,
                               task_id=claimant.task_id)
        with self._written_with_history(move.recorded or states.move(DUPLICATE).recorded):
            started = self._start_before_claim(**key) if move.records_start else None
            matched = self._jobs().filter(guard, state=source, **key).update(
                state=State.RUNNING, attempt=F("attempt") + 1, worker=claimant.worker,
                task_id=claimant.task_id, lease_expires_at=claimant.lease_expires_at,
                not_before=None, started_at=now, updated_at=now,
            )
            # The attempt this claim holds, read back. Outside a transaction the UPDATE
            # has committed, so the row is read as this claim left it unless another
            # claim took it over in between: then this one lost.
            row = self._row(**key)
            if matched and row is not None and holds(row, claimant):
                if move.recorded:
                    line = Change(row.id, move.event, source, worker=claimant.worker,
                                  task_id=claimant.task_id, reason=reason)
                    self._history(row.id, line, State.RUNNING, row.attempt, now,
                                  started=started)
                return ClaimOutcome(True, row)
            # A replay only reads, unless the table records the duplicate.
            recorded = row is not None and states.move(DUPLICATE).recorded and self._apply(
                Change(row.id, DUPLICATE, row.state, attempt=row.attempt,
                       worker=claimant.worker, task_id=claimant.task_id,
                       reason=DUPLICATE_REASON, fingerprint=intent.fingerprint),
                states.move(DUPLICATE), now) is not None
            return ClaimOutcome(False, row, recorded)

    def _apply(self, change: Change, move: Move, now: datetime) -> int | None:
        jobs = self._jobs().filter(_guard(change, now), id=change.job_id)
        if move.target is None and not change.values:
            return self._record(change, move, jobs, now)
        attempt = change.attempt  # every move that writes the row is fenced
        assert attempt is not None
        with self._written_with_history(move.recorded):
            if not jobs.filter(state=change.from_state).update(
                    state=change.to_state, updated_at=now, **change.values):
                return None
            if move.recorded:
                # The move does not write started_at (only a claim does): the row's,
                # read by the INSERT itself, is still the ended attempt's.
                started = Subquery(Job.objects.filter(id=change.job_id).values(
                    "started_at")[:1]) if move.records_start else None
                self._history(change.job_id, change, change.to_state, attempt, now,
                              started=started)
        return int(attempt)

    def _record(self, change: Change, move: Move, jobs: Any, now: datetime) -> int | None:
        """A move that only records history: the row is not written, only checked (and
        locked where the database can); the line says the state the row is in."""
        with transaction.atomic(using=self.alias):
            found = jobs.filter(state__in=move.source_values()).select_for_update() \
                .values_list("attempt", "state").first()
            if found is None:
                return None
            attempt = change.attempt if change.attempt is not None else found[0]
            if move.recorded:
                self._history(change.job_id, change, State(found[1]), attempt, now,
                              from_state=State(found[1]))
            return int(attempt)

    def _written_with_history(self, recorded: bool) -> AbstractContextManager[Any]:
        """A transaction for a write and its history line; none for a write without one:
        its conditional UPDATE is atomic alone, in autocommit or in the caller's
        transaction (which its failure fails anyway: nothing here catches it)."""
        return transaction.atomic(using=self.alias) if recorded else nullcontext()

    def _apply_batch(self, changes: list[Change], now: datetime) -> set[int]:
        # One UPDATE for changes that differ only in their job (a batch's ``sent`` marks
        # after its commit), after one locking read of the rows that match the guard;
        # anything else (a move that records history, or only records it, or changes
        # that differ) one change at a time.
        first = changes[0]
        if first.move.recorded or not (first.move.target or first.values) or any(
                _write(c) != _write(first) for c in changes):
            return super()._apply_batch(changes, now)
        with transaction.atomic(using=self.alias):
            self._take_write_lock()
            moved = set(self._jobs().filter(
                _guard(first, now), id__in=[c.job_id for c in changes],
                state=first.from_state).select_for_update().values_list("id", flat=True))
            if moved:
                self._jobs().filter(id__in=moved).update(
                    state=first.to_state, updated_at=now, **first.values)
        return moved

    def _take_write_lock(self) -> None:
        """Where the database has no row locks (SQLite, which silently ignores FOR
        UPDATE): an UPDATE that matches nothing takes the database's write lock now, so a
        read-then-write transaction waits for a concurrent writer instead of failing."""
        if not connections[self.alias].features.has_select_for_update:
            self._jobs().filter(id=-1).update(updated_at=F("updated_at"))

    # -- step checkpoints ----------------------------------------------------------------

    def _save_step(self, change: Change, step: str, value: Any, now: datetime) -> StepWrite:
        m = change.move
        owner = self._jobs().filter(states.guard_q(m, now=now, attempt=change.attempt),
                                    id=change.job_id, state=change.from_state)
        with transaction.atomic(using=self.alias):
            # A no-op UPDATE, not a read: it takes the row's lock (SQLite: the write lock)
            # so a concurrent take-over cannot slip in before the checkpoint commits.
            if not owner.update(attempt=F("attempt")):
                return StepWrite.FENCED
            try:
                with transaction.atomic(using=self.alias):
                    Checkpoint.objects.using(self.alias).create(
                        job_id=change.job_id, step=step, value=value, attempt=change.attempt,
                        at=now)
            except IntegrityError:
                return StepWrite.EXISTS
            if m.recorded:
                assert change.from_state is not None and change.attempt is not None
                self._history(change.job_id, change, change.from_state, change.attempt, now)
        return StepWrite.STORED

    def read_step(self, job_id: int, step: str) -> tuple[bool, Any]:
        found = list(Checkpoint.objects.using(self.alias).filter(job_id=job_id, step=step)
                     .values_list("value", flat=True)[:1])
        return (True, found[0]) if found else (False, None)

    def clear_steps(self, job_id: int) -> int:
        deleted, _ = Checkpoint.objects.using(self.alias).filter(job_id=job_id).delete()
        return int(deleted)

    # -- reads ---------------------------------------------------------------------------

    @contextmanager
    def locked_batch(self, condition: Q, limit: int,
                     order: tuple[str, ...]) -> Iterator[list[Job]]:
        features = connections[self.alias].features
        with transaction.atomic(using=self.alias):
            jobs = self._jobs().filter(condition).order_by(*order)
            if features.has_select_for_update_skip_locked:  # MySQL 8, MariaDB 10.6
                jobs = jobs.select_for_update(skip_locked=True)
            elif features.has_select_for_update:  # older MariaDB: wait for the other pass
                jobs = jobs.select_for_update()
            else:
                # A concurrent pass waits for this batch to commit and then sees its
                # writes, instead of both acting on the same rows.
                self._take_write_lock()
            yield list(jobs[:limit])

    def attempts_since_reset(self, job_id: int, attempt: int) -> int:
        base = (Transition.objects.using(self.alias).filter(job_id=job_id, event="reset")
                .order_by("-id").values_list("attempt", flat=True).first())
        return attempt - (base or 0)

    def task_names(self, limit: int) -> list[str]:
        return list(self._jobs().order_by("task_name").values_list("task_name", flat=True)
                    .distinct()[:limit])
