"""The PostgreSQL backend: each move rendered as one statement, one round trip.

The statements are named queries in ``postgresql.sql`` beside this module, rendered per
move by ``queries``; this module runs them, on Django's connection or on the worker's
bookkeeping connection (``celery_idem.connection``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from django.db import DataError, connections, transaction
from django.db.models import Q

from .. import states
from ..conf import settings as idem_settings
from ..connection import bookkeeping_connection
from ..models import Job
from ..states import Move, State, StepWrite
from . import pipeline, prepared, routines
from .base import Backend
from .queries import (
    DIVISION_BY_ZERO,
    QUERIES,
    batch_sql,
    claim_sql,
    commit_new_sql,
    insert_batch_sql,
    insert_sql,
    move_sql,
    step_sql,
)
from .values import (
    DUPLICATE,
    DUPLICATE_REASON,
    JSON_COLUMNS,
    Change,
    Claimant,
    ClaimOutcome,
    Intent,
    json_text,
    row_from_tuple,
)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _param(column: str, value: Any) -> Any:
    """A value for a job column as the driver should send it (JSON columns as text)."""
    return json_text(value) if column in JSON_COLUMNS else value


def _intent_params(intent: Intent, now: datetime) -> dict[str, Any]:
    """What an insert of the key's row writes from ``intent`` (the intent's columns)."""
    return {
        "namespace": intent.namespace, "key": intent.key, "task_name": intent.task_name,
        "fingerprint": intent.fingerprint, "args": json_text(intent.args),
        "kwargs": json_text(intent.kwargs), "options": json_text(intent.options),
        "message": json_text(intent.message), "not_before": intent.not_before,
        "expires_at": intent.expires_at, "sent_at": now if intent.sent else None,
        "parent": intent.parent_id,
    }


def _move_params(change: Change, move: Move, now: datetime) -> dict[str, Any]:
    return {
        "id": change.job_id, "event": change.event,
        "from_state": None if change.from_state is None else change.from_state.value,
        "to_state": change.to_state.value, "sources": move.source_values(),
        "attempt": change.attempt, "fingerprint": change.fingerprint,
        "dispatch_count": change.dispatch_count, "now": now, "worker": change.worker,
        "task_id": change.task_id, "reason": change.reason, "actor": change.actor,
        **{f"v_{c}": _param(c, v) for c, v in change.values.items()},
    }


def _outcome(rows: list[tuple[Any, ...]]) -> ClaimOutcome:
    if not rows:
        return ClaimOutcome(False, None)
    won, recorded, *values = rows[0]
    return ClaimOutcome(bool(won), row_from_tuple(values, won=bool(won)), bool(recorded))


#: Set while the backend's writes run each in a savepoint of its own (``savepoint``).
_in_savepoint: ContextVar[bool] = ContextVar("celery_idem_in_savepoint", default=False)


class _InSavepoint:
    """``PostgreSQLBackend.savepoint``: the writes in it are each sent with their
    savepoint, in one round trip (``pipeline.fetch_together``)."""

    def __enter__(self) -> None:
        self.token = _in_savepoint.set(True)

    def __exit__(self, *exc: object) -> None:
        _in_savepoint.reset(self.token)


class PostgreSQLBackend(Backend):
    """Backend for PostgreSQL: one statement per step.

    ``dedicated``: run on the process's own bookkeeping connection
    (``celery_idem.connection``) instead of Django's; only for autocommitted writes that
    need not share a transaction with the caller.
    """

    def __init__(self, alias: str, dedicated: bool = False) -> None:
        super().__init__(alias)
        self.dedicated = dedicated

    def _connection(self) -> Any:
        if self.dedicated:
            return bookkeeping_connection(self.alias)
        return connections[self.alias]

    def connection(self) -> Any:
        return self._connection()

    def state_of(self, job_id: int) -> tuple[State, int] | None:
        rows = self._fetch(f"SELECT state, attempt FROM {Job._meta.db_table} "
                           "WHERE id = %(id)s", {"id": job_id})
        return (State(rows[0][0]), int(rows[0][1])) if rows else None

    def _fetch(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        return self._run(self._connection(), sql, params)

    @staticmethod
    def _run(connection: Any, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        if _in_savepoint.get() and connection.in_atomic_block:
            # An intent in the caller's transaction with its savepoint: one round trip.
            return pipeline.fetch_together(connection, sql, params)
        # Prepared only where the settings ask for it (backends.prepared).
        return prepared.fetch(connection, sql, params)

    def savepoint(self) -> AbstractContextManager[Any]:
        # Where pipelines are missing (psycopg 2, an old libpq): Django's, two round trips
        # more around the write.
        return _InSavepoint() if pipeline.supported() else super().savepoint()

    def _write(self, sql: str, params: dict[str, Any], *,
               flush: bool = False) -> list[tuple[Any, ...]]:
        """A statement that writes, or its stored routine's call. On the bookkeeping
        connection its commit does not wait for the WAL flush
        (CELERY_IDEM_SYNCHRONOUS_COMMIT off), unless ``flush``: transaction-scoped,
        nothing stays on the session (set in the routine, or pipeline.fetch_unflushed)."""
        connection = self._connection()
        # Only a statement that is its own transaction: in an open one, the setting would
        # reach that transaction's commit.
        unflushed = (self.dedicated and not flush and not idem_settings.SYNCHRONOUS_COMMIT
                     and connection.get_autocommit())
        call = routines.call_or(connection, sql, params, unflushed)
        if unflushed and call is sql:
            return pipeline.fetch_unflushed(connection, sql, params)
        return self._run(connection, call, params)

    def _insert(self, move: Move, intent: Intent, now: datetime, *, task_id: str,
                claimant: Claimant | None = None, reason: str = "") -> ClaimOutcome:
        assert move.target is not None
        # An intent's commit waits for the WAL flush wherever it is written: its message
        # is about to leave, and an intent a crash lost would have it refused, not run.
        return _outcome(self._write(insert_sql(move.event), {
            **_intent_params(intent, now),
            "to_state": move.target.value, "event": move.event, "task_id": task_id,
            "now": now, "reason": reason, "from_state": None,
            "attempt": 0 if claimant is None else 1,
            "worker": "" if claimant is None else claimant.worker,
            "lease": None if claimant is None else claimant.lease_expires_at,
            "started_at": None if claimant is None else now,
        }, flush=claimant is None))

    def _commit_new(self, move: Move, intent: Intent, claimant: Claimant,
                    ended: dict[str, Any]) -> int | None:
        assert move.target is not None
        params = {
            **_intent_params(intent, claimant.now),
            "to_state": move.target.value, "worker": claimant.worker,
            "task_id": claimant.task_id, "now": claimant.now,
            **{f"v_{c}": _param(c, v) for c, v in ended.items()},
        }
        # Not pipelined with the COMMIT, as ``_apply_final`` is: measured, the round trip
        # it saves costs more in the client than it saves end to end
        # (docs/decisions/2026-11-28-optimistic-atomic-mode.md).
        rows = self._write(commit_new_sql(move.event), params)
        return int(rows[0][0]) if rows else None

    def _insert_many(self, move: Move, intents: list[tuple[Intent, str]],
                     now: datetime) -> dict[tuple[str, str], ClaimOutcome]:
        assert move.target is not None
        sent = now.isoformat()
        rows = self._write(insert_batch_sql(move.event), {
            "rows": json.dumps([{
                "namespace": i.namespace, "key": i.key, "task_name": i.task_name,
                "fingerprint": i.fingerprint, "args": i.args, "kwargs": i.kwargs,
                "options": i.options, "task_id": task_id, "parent_id": i.parent_id,
                "message": i.message, "not_before": _iso(i.not_before),
                "expires_at": _iso(i.expires_at), "sent_at": sent if i.sent else None,
            } for i, task_id in intents]),
            "to_state": move.target.value, "event": move.event, "from_state": None,
            "now": now,
        }, flush=True)  # as ``_insert``: the messages are about to leave
        return {(namespace, key): ClaimOutcome(bool(won), row_from_tuple(row, won=bool(won)))
                for won, _, namespace, key, *row in rows}

    def _claim(self, move: Move, source: State, intent: Intent, claimant: Claimant,
               reason: str) -> ClaimOutcome:
        duplicate = states.move(DUPLICATE)
        return _outcome(self._write(claim_sql(move.event), {
            "namespace": intent.namespace, "key": intent.key,
            "fingerprint": intent.fingerprint, "worker": claimant.worker,
            "task_id": claimant.task_id, "lease": claimant.lease_expires_at,
            "now": claimant.now, "event": move.event, "from_state": source.value,
            "to_state": State.RUNNING.value, "reason": reason, "duplicate": DUPLICATE,
            "duplicate_sources": duplicate.source_values(),
            "duplicate_reason": DUPLICATE_REASON,
        }))

    def _apply(self, change: Change, move: Move, now: datetime) -> int | None:
        rows = self._write(move_sql(move.event, tuple(sorted(change.values))),
                           _move_params(change, move, now))
        return int(rows[0][0]) if rows else None

    def _apply_final(self, change: Change, move: Move, now: datetime) -> int | None:
        connection = connections[self.alias]
        if self.dedicated or not pipeline.commits_at_exit(connection):
            return self._apply(change, move, now)
        # The move and the COMMIT in one round trip; a move that does not match fails
        # its statement (move_result_final), so nothing commits.
        sql = move_sql(move.event, tuple(sorted(change.values)), final=True)
        params = _move_params(change, move, now)
        try:
            pipeline.execute_and_commit(connection, routines.call_or(connection, sql, params),
                                        params)
        except DataError as exc:
            if pipeline.sqlstate(exc) != DIVISION_BY_ZERO:
                raise
            return None
        return change.attempt

    def _apply_batch(self, changes: list[Change], now: datetime) -> set[int]:
        groups: dict[tuple[str, State | None, tuple[str, ...]], list[Change]] = {}
        for c in changes:
            groups.setdefault((c.event, c.from_state, tuple(sorted(c.values))), []).append(c)
        db = connections[self.alias]
        moved: set[int] = set()
        for (event, from_state, columns), group in groups.items():
            assert from_state is not None
            types = tuple(Job._meta.get_field(c).db_type(db) or "text" for c in columns)
            params = {
                "event": event, "from_state": from_state.value,
                "to_state": group[0].to_state.value, "now": now,
                "ids": [c.job_id for c in group], "attempts": [c.attempt for c in group],
                "workers": [c.worker for c in group], "task_ids": [c.task_id for c in group],
                "reasons": [c.reason for c in group],
                **{f"v_{col}": [_param(col, c.values[col]) for c in group] for col in columns},
            }
            moved |= {job_id for (job_id,) in self._write(batch_sql(event, columns, types),
                                                         params)}
        return moved

    # -- step checkpoints ----------------------------------------------------------------

    def _save_step(self, change: Change, step: str, value: Any, now: datetime) -> StepWrite:
        assert change.from_state is not None
        ((owned, inserted),) = self._write(step_sql(change.event), {
            "id": change.job_id, "event": change.event, "from_state": change.from_state.value,
            "to_state": change.from_state.value, "attempt": change.attempt, "step": step,
            "value": json.dumps(value), "now": now, "worker": change.worker,
            "task_id": change.task_id, "reason": change.reason, "actor": change.actor,
        })
        return StepWrite.STORED if inserted else StepWrite.EXISTS if owned else StepWrite.FENCED

    def read_step(self, job_id: int, step: str) -> tuple[bool, Any]:
        rows = self._fetch(QUERIES["step_read"], {"id": job_id, "step": step})
        if not rows:
            return False, None
        return True, None if rows[0][0] is None else json.loads(rows[0][0])

    def clear_steps(self, job_id: int) -> int:
        return int(self._write(QUERIES["steps_clear"], {"id": job_id})[0][0])

    # -- reads ---------------------------------------------------------------------------

    @contextmanager
    def locked_batch(self, condition: Q, limit: int,
                     order: tuple[str, ...]) -> Iterator[list[Job]]:
        # SKIP LOCKED: a concurrent pass takes the next rows instead of waiting for these,
        # and re-checks the condition on rows committed meanwhile, so each is handled once.
        with transaction.atomic(using=self.alias):
            jobs = (Job.objects.using(self.alias).filter(condition)
                    .order_by(*order).select_for_update(skip_locked=True, of=("self",)))
            yield list(jobs[:limit])

    def attempts_since_reset(self, job_id: int, attempt: int) -> int:
        rows = self._fetch(QUERIES["attempts_since_reset"],
                           {"id": job_id, "attempt": attempt, "reset": "reset"})
        return int(rows[0][0])

    def task_names(self, limit: int) -> list[str]:
        return [name for (name,) in self._fetch(QUERIES["task_names"], {"limit": limit})]

    def held_pending(self, ids: list[int] | None,
                     limit: int) -> list[tuple[int, datetime | None]] | None:
        rows = self._fetch(QUERIES["held_pending"], {"pending": State.PENDING.value,
                                                     "ids": ids, "limit": limit})
        return [(int(job_id), since) for job_id, since in rows]

    def task_name_statistics(self) -> tuple[float, dict[str, float]] | None:
        table = {"table": Job._meta.db_table}
        found = self._fetch(QUERIES["job_rows_estimate"], table)
        if not found or found[0][0] < 0:
            return None
        stats = self._fetch(QUERIES["task_name_frequencies"], table)
        if not stats:
            return None
        names, shares = stats[0][0] or [], stats[0][1] or []
        return float(found[0][0]), dict(zip(names, shares, strict=True))
