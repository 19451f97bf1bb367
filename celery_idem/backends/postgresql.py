"""The PostgreSQL backend: each protocol step is one statement, one round trip.

Data-modifying CTEs let one statement do the conditional write, append its history row
and, when the write did not match, return the row that stood in the way. All the SQL that
only PostgreSQL runs lives in this module; ``generic.py`` is the portable fallback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import Q

from .. import states
from ..connection import bookkeeping_connection
from ..models import Job, Transition
from ..signals import announce
from ..states import State
from .base import (
    JSON_COLUMNS,
    ROW_COLUMNS,
    BatchMove,
    Claimant,
    ClaimOutcome,
    Intent,
    JobRow,
    checked_target,
    claim_reason,
)

JOB = Job._meta.db_table
HISTORY = Transition._meta.db_table
_HISTORY_COLUMNS = (
    "(job_id, event, from_state, to_state, attempt, worker, task_id, reason, actor, at)")
_ROW = ", ".join(ROW_COLUMNS)

# -- publish: insert the intent unless the key exists; else return the existing row --
PUBLISH = f"""
WITH ins AS (
    INSERT INTO {JOB} (namespace, key, task_name, args, kwargs, fingerprint, options, state,
                       attempt, worker, task_id, dispatch_count, created_at, updated_at)
    VALUES (%(namespace)s, %(key)s, %(task_name)s, %(args)s::jsonb, %(kwargs)s::jsonb,
            %(fingerprint)s, %(options)s::jsonb, 'PENDING', 0, '', %(task_id)s, 0,
            %(now)s, %(now)s)
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING {_ROW}
), hist AS (
    INSERT INTO {HISTORY} {_HISTORY_COLUMNS}
    SELECT id, 'published', NULL, 'PENDING', 0, '', %(task_id)s, '', '', %(now)s FROM ins
)
SELECT true, {_ROW} FROM ins
UNION ALL
SELECT false, {_ROW} FROM {JOB}
WHERE namespace = %(namespace)s AND key = %(key)s AND NOT EXISTS (SELECT 1 FROM ins)
"""

# -- claim: PENDING -> RUNNING (or expired RUNNING -> RUNNING), attempt + 1 ------------
# A retry scheduled for later (not_before) is claimable early only by its own message.
# When the claim does not match, the row as this statement's snapshot saw it comes back
# instead; a finished row also gets its ``duplicate`` history line in the same trip.
# The row is found by its unique key, then updated by primary key, and its state is
# compared through an expression no index matches (``state || ''``). Otherwise, while
# the statistics say PENDING rows are rare (after a burst of enqueues, until autoanalyze
# runs), the planner prefers the (state, updated_at) index and one claim scans the whole
# backlog for its key (tests/db/test_claim_plan.py).
CLAIM = f"""
WITH target AS (
    SELECT id FROM {JOB} WHERE namespace = %(namespace)s AND key = %(key)s
), claimed AS (
    UPDATE {JOB}
    SET state = 'RUNNING', attempt = attempt + 1, worker = %(worker)s, task_id = %(task_id)s,
        lease_expires_at = %(lease)s, not_before = NULL, started_at = %(now)s,
        updated_at = %(now)s
    WHERE id = (SELECT id FROM target) AND fingerprint = %(fingerprint)s
      AND state || '' = %(from_state)s
      AND (state <> 'RUNNING' OR lease_expires_at < %(now)s)
      AND (not_before IS NULL OR not_before <= %(now)s OR task_id = %(task_id)s)
    RETURNING {_ROW}
), hist AS (
    INSERT INTO {HISTORY} {_HISTORY_COLUMNS}
    SELECT id, %(event)s, %(from_state)s, 'RUNNING', attempt, %(worker)s, %(task_id)s,
           %(reason)s, '', %(now)s
    FROM claimed
), dup AS (
    INSERT INTO {HISTORY} {_HISTORY_COLUMNS}
    SELECT id, 'duplicate', state, state, attempt, %(worker)s, %(task_id)s,
           'replayed the stored outcome', '', %(now)s
    FROM {JOB}
    WHERE id = (SELECT id FROM target) AND fingerprint = %(fingerprint)s
      AND state || '' = ANY(%(finished)s) AND NOT EXISTS (SELECT 1 FROM claimed)
)
SELECT true, {_ROW} FROM claimed
UNION ALL
SELECT false, {_ROW} FROM {JOB}
WHERE id = (SELECT id FROM target) AND NOT EXISTS (SELECT 1 FROM claimed)
"""

# -- claim when the producer's intent is missing: insert the row already RUNNING -------
CLAIM_NEW = f"""
WITH ins AS (
    INSERT INTO {JOB} (namespace, key, task_name, args, kwargs, fingerprint, options, state,
                       attempt, worker, task_id, lease_expires_at, dispatch_count,
                       created_at, started_at, updated_at)
    VALUES (%(namespace)s, %(key)s, %(task_name)s, %(args)s::jsonb, %(kwargs)s::jsonb,
            %(fingerprint)s, %(options)s::jsonb, 'RUNNING', 1, %(worker)s, %(task_id)s,
            %(lease)s, 0, %(now)s, %(now)s, %(now)s)
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING {_ROW}
), hist AS (
    INSERT INTO {HISTORY} {_HISTORY_COLUMNS}
    SELECT id, 'claimed', NULL, 'RUNNING', 1, %(worker)s, %(task_id)s,
           'no intent was published', '', %(now)s
    FROM ins
)
SELECT {_ROW} FROM ins
"""

# -- transition: a conditional move that appends its history row ----------------------
TRANSITION = """
WITH moved AS (
    UPDATE {job} SET state = %(to_state)s, updated_at = %(now)s{sets}
    WHERE id = %(id)s AND state = %(from_state)s{attempt_guard}
    RETURNING id, attempt
), hist AS (
    INSERT INTO {history} {columns}
    SELECT id, %(event)s, %(from_state)s, %(to_state)s, attempt, %(worker)s, %(task_id)s,
           %(reason)s, %(actor)s, %(now)s
    FROM moved
)
SELECT attempt FROM moved
"""

# -- many moves of one kind in one statement (recovery): per-row values come as arrays --
TRANSITION_BATCH = """
WITH v AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(workers)s::text[],
                         %(task_ids)s::text[], %(reasons)s::text[]{arrays})
        AS v (id, attempt, h_worker, h_task_id, h_reason{names})
), moved AS (
    UPDATE {job} AS j SET state = %(to_state)s, updated_at = %(now)s{sets}
    FROM v WHERE j.id = v.id AND j.state = %(from_state)s AND j.attempt = v.attempt
    RETURNING j.id, j.attempt, v.h_worker, v.h_task_id, v.h_reason
), hist AS (
    INSERT INTO {history} {columns}
    SELECT id, %(event)s, %(from_state)s, %(to_state)s, attempt, h_worker, h_task_id,
           h_reason, '', %(now)s
    FROM moved
)
SELECT id FROM moved
"""

RECORD = f"""
INSERT INTO {HISTORY} {_HISTORY_COLUMNS}
VALUES (%(id)s, %(event)s, %(state)s, %(state)s, %(attempt)s, %(worker)s, %(task_id)s,
        %(reason)s, '', %(now)s)
"""

HEARTBEAT = f"""
UPDATE {JOB} SET lease_expires_at = %(lease)s, updated_at = %(now)s
WHERE id = %(id)s AND state = 'RUNNING' AND attempt = %(attempt)s
"""


# -- recovery: a PENDING job's message was sent again; count it, keep the new task id ---
# Guarded by attempt and dispatch count, so of two passes that saw the same row, one wins.
REDISPATCHED = f"""
WITH moved AS (
    UPDATE {JOB} SET dispatch_count = dispatch_count + 1, task_id = %(task_id)s,
                     updated_at = %(now)s
    WHERE id = %(id)s AND state = 'PENDING' AND attempt = %(attempt)s
      AND dispatch_count = %(dispatch_count)s
    RETURNING id, attempt
), hist AS (
    INSERT INTO {HISTORY} {_HISTORY_COLUMNS}
    SELECT id, 'redispatched', 'PENDING', 'PENDING', attempt, '', %(task_id)s, %(reason)s,
           '', %(now)s
    FROM moved
)
SELECT attempt FROM moved
"""

# -- the distinct task names, for the admin's filter --------------------------------------
# A loose index scan: each step takes the next name from the (task_name, created_at)
# index, one probe per name instead of a DISTINCT over every job.
TASK_NAMES = f"""
WITH RECURSIVE names (name) AS (
    SELECT MIN(task_name) FROM {JOB}
    UNION ALL
    SELECT (SELECT MIN(task_name) FROM {JOB} WHERE task_name > names.name)
    FROM names WHERE names.name IS NOT NULL
)
SELECT name FROM names WHERE name IS NOT NULL LIMIT %(limit)s
"""


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _param(column: str, value: Any) -> Any:
    """A value for a job column as the driver should send it (JSON columns as text)."""
    return _json(value) if column in JSON_COLUMNS else value


def _intent_params(intent: Intent) -> dict[str, Any]:
    return {
        "namespace": intent.namespace, "key": intent.key, "task_name": intent.task_name,
        "fingerprint": intent.fingerprint, "args": _json(intent.args),
        "kwargs": _json(intent.kwargs), "options": _json(intent.options),
    }


def _row(values: tuple[Any, ...]) -> JobRow:
    row = dict(zip(ROW_COLUMNS, values, strict=True))
    # Django registers a text loader for jsonb (JSONField parses in Python), so raw
    # cursors get JSON text back.
    for col in ("result", "error"):
        if isinstance(row[col], str):
            row[col] = json.loads(row[col])
    return JobRow.from_values(row)


def _outcome(rows: list[tuple[Any, ...]]) -> ClaimOutcome:
    if not rows:
        return ClaimOutcome(False, None)
    won, *values = rows[0]
    return ClaimOutcome(bool(won), _row(tuple(values)))


class PostgreSQLBackend:
    """Backend for PostgreSQL: one statement per step."""

    def __init__(self, alias: str, dedicated: bool = False) -> None:
        self.alias = alias
        self.dedicated = dedicated

    def _connection(self) -> Any:
        if self.dedicated:
            return bookkeeping_connection(self.alias)
        return connections[self.alias]

    def _fetch(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self._connection().cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    def publish(self, intent: Intent, task_id: str, now: datetime) -> ClaimOutcome:
        rows = self._fetch(PUBLISH, {**_intent_params(intent), "task_id": task_id, "now": now})
        outcome = _outcome(rows)
        if outcome.won:
            announce(self.alias, outcome.row.id, "published", None, State.PENDING, 0,
                     task_id=task_id)
        return outcome

    def claim(self, intent: Intent, claimant: Claimant) -> ClaimOutcome:
        params = {
            **_intent_params(intent), "worker": claimant.worker, "task_id": claimant.task_id,
            "lease": claimant.lease_expires_at, "now": claimant.now,
            "finished": [s.value for s in states.FINISHED],
        }
        outcome = self._claim(params, "claimed", State.PENDING)
        if outcome.row is None:
            rows = self._fetch(CLAIM_NEW, params)
            if rows:
                row = _row(rows[0])
                announce(self.alias, row.id, "claimed", None, State.RUNNING, 1,
                         claimant.worker, claimant.task_id, "no intent was published")
                return ClaimOutcome(True, row)
            outcome = self._claim(params, "claimed", State.PENDING)  # lost the insert race
        row = outcome.row
        if (not outcome.won and row is not None and row.state is State.RUNNING
                and row.fingerprint == intent.fingerprint
                and row.lease_expires_at is not None and row.lease_expires_at < claimant.now):
            return self._claim(params, "taken_over", State.RUNNING)
        return outcome

    def _claim(self, params: dict[str, Any], event: str, from_state: State) -> ClaimOutcome:
        states.check(from_state, states.move(event).target)
        reason = claim_reason(event)
        rows = self._fetch(
            CLAIM, {**params, "event": event, "from_state": from_state.value, "reason": reason}
        )
        outcome = _outcome(rows)
        row = outcome.row
        if outcome.won:
            announce(self.alias, row.id, event, from_state, State.RUNNING, row.attempt,
                     params["worker"], params["task_id"], reason)
        elif row is not None and row.state in states.FINISHED \
                and row.fingerprint == params["fingerprint"]:
            announce(self.alias, row.id, "duplicate", row.state, row.state, row.attempt,
                     params["worker"], params["task_id"], "replayed the stored outcome")
        return outcome

    def transition(
        self, job_id: int, event: str, from_state: State, *, attempt: int | None,
        values: dict[str, Any], now: datetime, worker: str = "", task_id: str = "",
        reason: str = "", actor: str = "",
    ) -> bool:
        target = checked_target(event, from_state, values)
        sets = "".join(
            f", {col} = %(v_{col})s::jsonb" if col in JSON_COLUMNS else f", {col} = %(v_{col})s"
            for col in sorted(values)
        )
        sql = TRANSITION.format(
            job=JOB, history=HISTORY, columns=_HISTORY_COLUMNS, sets=sets,
            attempt_guard=" AND attempt = %(attempt)s" if attempt is not None else "",
        )
        params = {
            "id": job_id, "event": event, "from_state": from_state.value,
            "to_state": target.value, "attempt": attempt, "now": now, "worker": worker,
            "task_id": task_id, "reason": reason, "actor": actor,
            **{f"v_{col}": _param(col, v) for col, v in values.items()},
        }
        rows = self._fetch(sql, params)
        if not rows:
            return False
        announce(self.alias, job_id, event, from_state, target, rows[0][0], worker, task_id,
                 reason, actor)
        return True

    def transition_batch(self, moves: list[BatchMove], now: datetime) -> set[int]:
        groups: dict[tuple[str, State, tuple[str, ...]], list[BatchMove]] = {}
        for m in moves:
            groups.setdefault((m.event, m.from_state, tuple(sorted(m.values))), []).append(m)
        db = connections[self.alias]
        moved: set[int] = set()
        for (event, from_state, columns), group in groups.items():
            target = checked_target(event, from_state, group[0].values)
            types = {c: Job._meta.get_field(c).db_type(db) for c in columns}
            sql = TRANSITION_BATCH.format(
                job=JOB, history=HISTORY, columns=_HISTORY_COLUMNS,
                arrays="".join(f", %(v_{c})s::{types[c]}[]" for c in columns),
                names="".join(f", v_{c}" for c in columns),
                sets="".join(f", {c} = v.v_{c}" for c in columns),
            )
            params = {
                "event": event, "from_state": from_state.value, "to_state": target.value,
                "now": now, "ids": [m.job_id for m in group],
                "attempts": [m.attempt for m in group], "workers": [m.worker for m in group],
                "task_ids": [m.task_id for m in group], "reasons": [m.reason for m in group],
                **{f"v_{c}": [_param(c, m.values[c]) for m in group] for c in columns},
            }
            matched = {job_id for (job_id,) in self._fetch(sql, params)}
            for m in group:
                if m.job_id in matched:
                    announce(self.alias, m.job_id, event, from_state, target, m.attempt,
                             m.worker, m.task_id, m.reason)
            moved |= matched
        return moved

    def record(
        self, job_id: int, event: str, state: State, attempt: int, *, now: datetime,
        worker: str = "", task_id: str = "", reason: str = "",
    ) -> None:
        assert states.move(event).target is None
        with self._connection().cursor() as cursor:
            cursor.execute(RECORD, {
                "id": job_id, "event": event, "state": state.value, "attempt": attempt,
                "worker": worker, "task_id": task_id, "reason": reason, "now": now,
            })
        announce(self.alias, job_id, event, state, state, attempt, worker, task_id, reason)

    def heartbeat(self, job_id: int, attempt: int, lease_expires_at: datetime,
                  now: datetime) -> bool:
        with self._connection().cursor() as cursor:
            cursor.execute(HEARTBEAT, {"id": job_id, "attempt": attempt,
                                       "lease": lease_expires_at, "now": now})
            return cursor.rowcount == 1

    # -- recovery ----------------------------------------------------------------------

    @contextmanager
    def locked_batch(self, condition: Q, after_id: int, limit: int) -> Iterator[list[Job]]:
        # SKIP LOCKED: a concurrent pass takes the next rows instead of waiting for these,
        # and re-checks the condition on rows committed meanwhile, so each is handled once.
        with transaction.atomic(using=self.alias):
            jobs = (Job.objects.using(self.alias).filter(condition, id__gt=after_id)
                    .order_by("id").select_for_update(skip_locked=True, of=("self",)))
            yield list(jobs[:limit])

    def mark_redispatched(self, job_id: int, attempt: int, dispatch_count: int, *,
                          task_id: str, now: datetime, reason: str) -> bool:
        rows = self._fetch(REDISPATCHED, {
            "id": job_id, "attempt": attempt, "dispatch_count": dispatch_count,
            "task_id": task_id, "now": now, "reason": reason,
        })
        if not rows:
            return False
        announce(self.alias, job_id, "redispatched", State.PENDING, State.PENDING, attempt,
                 task_id=task_id, reason=reason)
        return True

    def task_names(self, limit: int) -> list[str]:
        return [name for (name,) in self._fetch(TASK_NAMES, {"limit": limit})]
