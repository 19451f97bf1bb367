"""The MySQL/MariaDB backend: the portable backend, with the hot path's intent, claim
and commit as named queries (``mysql.sql`` beside this module) instead of ORM queries.

Why: MySQL has no ``UPDATE ... RETURNING``, so the statements are the portable
backend's (a claim is its conditional UPDATE and a read of the attempt it took, a commit
one UPDATE), but building and compiling an ORM query costs the worker more CPU than the
statement's round trip. The text is rendered once per move from the move table, as on
PostgreSQL (``queries.render_guard``), and runs on Django's cursor, so its error
translation and query log see it. An intent outside a transaction, and the read of a
key's row (after a claim, or an intent that found the key), and a batch's intents (one
multi-row INSERT, then a read of its keys' rows) are named queries too. Moves that
record history, an intent in the caller's transaction (its savepoint), steps and the
other reads are the portable backend's.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connections
from django.db.utils import load_backend

from .. import states
from ..models import Job
from ..states import Move, State
from .generic import GenericBackend, keys_by_namespace, read_back
from .queries import load_queries, render_guard
from .values import (
    DUPLICATE,
    ROW_COLUMNS,
    Change,
    Claimant,
    ClaimOutcome,
    Intent,
    JobRow,
    holds,
    json_text,
    row_from_tuple,
)

QUERIES = load_queries(Path(__file__).with_name("mysql.sql"))
#: The row's datetime columns, by position.
_DATETIMES_AT = tuple(i for i, column in enumerate(ROW_COLUMNS)
                      if Job._meta.get_field(column).get_internal_type() == "DateTimeField")


@cache
def claim_sql(event: str) -> str:
    return QUERIES["claim"].replace("{guard}", render_guard(states.move(event).guard, QUERIES))


@cache
def move_sql(event: str, columns: tuple[str, ...]) -> str:
    sets = "".join(f", {column} = %(v_{column})s" for column in columns)
    return (QUERIES["move"].replace("{sets}", sets)
            .replace("{guard}", render_guard(states.move(event).guard, QUERIES)))


# Not cached, unlike the moves' statements: one text per batch size would be kept.
def insert_many_sql(rows: int) -> str:
    return QUERIES["insert_many"].replace(
        "{values}", ", ".join([QUERIES["insert_many_row"]] * rows))


def rows_of_keys_sql(keys: int) -> str:
    return QUERIES["rows_of_keys"].replace("{keys}", ", ".join(["%s"] * keys))


class MySQLBackend(GenericBackend):
    """Backend for MySQL/MariaDB: see the module docstring."""

    def _insert(self, move: Move, intent: Intent, now: datetime, *, task_id: str,
                claimant: Claimant | None = None, reason: str = "") -> ClaimOutcome:
        connection = connections[self.alias]
        if move.recorded or not connection.get_autocommit():
            # A history line, or the caller's transaction (a savepoint for the conflict).
            return super()._insert(move, intent, now, task_id=task_id, claimant=claimant,
                                   reason=reason)
        assert move.target is not None
        adapt = connection.ops.adapt_datetimefield_value
        lease = None if claimant is None else claimant.lease_expires_at
        attempt = 0 if claimant is None else 1
        try:
            with connection.cursor() as cursor:
                cursor.execute(QUERIES["insert"], {
                    "namespace": intent.namespace, "key": intent.key,
                    "task_name": intent.task_name, "fingerprint": intent.fingerprint,
                    "args": json_text(intent.args), "kwargs": json_text(intent.kwargs),
                    "options": json_text(intent.options), "message": json_text(intent.message),
                    "to_state": move.target.value, "attempt": attempt,
                    "worker": "" if claimant is None else claimant.worker,
                    "task_id": task_id, "lease_expires_at": adapt(lease), "now": adapt(now),
                    "started_at": None if claimant is None else adapt(now),
                    "parent": intent.parent_id, "not_before": adapt(intent.not_before),
                    "expires_at": adapt(intent.expires_at),
                    "sent_at": adapt(now) if intent.sent else None,
                })
                job_id = cursor.lastrowid
        except IntegrityError:  # the key exists: its own statement failed, nothing else
            return ClaimOutcome(False, self._row(namespace=intent.namespace, key=intent.key))
        return ClaimOutcome(True, JobRow(
            job_id, move.target, attempt, intent.fingerprint, task_id, lease,
            intent.not_before, None, None, intent.args, intent.kwargs))

    def _insert_many(self, move: Move, intents: list[tuple[Intent, str]],
                     now: datetime) -> dict[tuple[str, str], ClaimOutcome]:
        if move.recorded:
            return super()._insert_many(move, intents, now)
        assert move.target is not None
        connection = connections[self.alias]
        adapt = connection.ops.adapt_datetimefield_value
        at = adapt(now)
        params: list[Any] = []
        for intent, task_id in intents:  # in insert_many_row's order
            params += (intent.namespace, intent.key, intent.task_name, json_text(intent.args),
                       json_text(intent.kwargs), intent.fingerprint, json_text(intent.options),
                       move.target.value, task_id, at, at, intent.parent_id,
                       json_text(intent.message), adapt(intent.not_before),
                       adapt(intent.expires_at), at if intent.sent else None)
        outcomes = {}
        # Read back as the portable backend's (``read_back``), each statement alone (a write
        # alone is one round trip): nothing rewrites a row's task id or created_at before
        # its message has left.
        with connection.cursor() as cursor:
            cursor.execute(insert_many_sql(len(intents)), params)
            for namespace, keys in keys_by_namespace(intents).items():
                cursor.execute(rows_of_keys_sql(len(keys)), [namespace, *keys])
                for key, created_at, *values in cursor.fetchall():
                    outcomes[namespace, key] = read_back(
                        _job_row(values, connection), _aware(created_at, connection), now,
                        keys[key])
        return outcomes

    def _claim(self, move: Move, source: State, intent: Intent, claimant: Claimant,
               reason: str) -> ClaimOutcome:
        if move.recorded or states.move(DUPLICATE).recorded:
            return super()._claim(move, source, intent, claimant, reason)
        connection = connections[self.alias]
        adapt = connection.ops.adapt_datetimefield_value
        params = {"namespace": intent.namespace, "key": intent.key, "source": source.value,
                  "running": State.RUNNING.value, "fingerprint": intent.fingerprint,
                  "worker": claimant.worker, "task_id": claimant.task_id,
                  "lease_expires_at": adapt(claimant.lease_expires_at),
                  "now": adapt(claimant.now)}
        # In the caller's transaction, or each statement its own (as in the portable
        # backend: ``holds`` then checks the row read back is still this claim's).
        with connection.cursor() as cursor:
            cursor.execute(claim_sql(move.event), params)
            matched = cursor.rowcount
        row = self._row(namespace=intent.namespace, key=intent.key)
        return ClaimOutcome(bool(matched) and holds(row, claimant), row)

    def _row(self, **lookup: Any) -> JobRow | None:
        if lookup.keys() != {"namespace", "key"}:
            return super()._row(**lookup)
        connection = connections[self.alias]
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["row"], lookup)
            found = cursor.fetchone()
        return None if found is None else _job_row(found, connection)

    def held_pending(self, ids: list[int] | None,
                     limit: int) -> list[tuple[int, datetime | None]] | None:
        held = _held(self.alias, ids, limit)
        return None if held is None else [(job_id, None) for job_id in held]

    def _apply(self, change: Change, move: Move, now: datetime) -> int | None:
        if move.recorded or (move.target is None and not change.values):
            return super()._apply(change, move, now)
        connection = connections[self.alias]
        params = {"id": change.job_id, "to_state": change.to_state.value,
                  "from_state": None if change.from_state is None else change.from_state.value,
                  "attempt": change.attempt, "fingerprint": change.fingerprint,
                  "dispatch_count": change.dispatch_count, "task_id": change.task_id,
                  "now": connection.ops.adapt_datetimefield_value(now),
                  # As the ORM would send each value (JSON as text, datetimes adapted).
                  **{f"v_{column}": Job._meta.get_field(column).get_db_prep_save(
                      value, connection) for column, value in change.values.items()}}
        attempt = change.attempt  # every move that writes the row is fenced
        assert attempt is not None
        with connection.cursor() as cursor:
            cursor.execute(move_sql(change.event, tuple(change.values)), params)
            matched = cursor.rowcount
        return attempt if matched else None


def _held(alias: str, ids: list[int] | None, limit: int) -> list[int] | None:
    """``Backend.held_pending`` on MySQL/MariaDB (without the start, which InnoDB does not
    tie to rows): the PENDING rows (the first ``limit`` by id, among ``ids``) that a
    locking read with SKIP LOCKED passes over, and that are still PENDING afterwards (a
    claim committed meanwhile is RUNNING now). On a connection of its own, so the shared
    locks it takes are never held by a caller's transaction, in a transaction rolled
    back at once; its rows are looked up by primary key (no gap is locked). None where
    the server has no SKIP LOCKED (MySQL before 8, MariaDB before 10.6)."""
    if not connections[alias].features.has_select_for_update_skip_locked:
        return None
    if ids is not None and not ids:
        return []
    pending = State.PENDING.value
    probe = own_connection(alias)
    try:
        with probe.cursor() as cursor:
            among = f"AND id IN ({', '.join(['%s'] * len(ids))})" if ids else ""
            cursor.execute(QUERIES["pending_ids"].replace("{ids}", among),
                           [pending, *(ids or []), limit])
            candidates = [job_id for (job_id,) in cursor.fetchall()]
            if not candidates:
                return []
            marks = ", ".join(["%s"] * len(candidates))
            share = "LOCK IN SHARE MODE" if probe.mysql_is_mariadb else "FOR SHARE"
            cursor.execute("START TRANSACTION")
            try:
                cursor.execute(QUERIES["pending_unlocked"].replace("{ids}", marks)
                               .replace("{share}", share), [pending, *candidates])
                free = {job_id for (job_id,) in cursor.fetchall()}
            finally:
                cursor.execute("ROLLBACK")
            held = [job_id for job_id in candidates if job_id not in free]
            if not held:
                return []
            cursor.execute(QUERIES["pending_ids"].replace(
                "{ids}", f"AND id IN ({', '.join(['%s'] * len(held))})"),
                [pending, *held, limit])
            return [int(job_id) for (job_id,) in cursor.fetchall()]
    finally:
        probe.close()


def own_connection(alias: str) -> Any:
    """A new connection with ``alias``'s settings, that no one else uses (close it)."""
    params = copy.deepcopy(connections[alias].settings_dict)
    params["CONN_MAX_AGE"] = 0
    return load_backend(params["ENGINE"]).DatabaseWrapper(params, alias)


def _job_row(found: Sequence[Any], connection: Any) -> JobRow:
    """The JobRow of ROW_COLUMNS as the driver returned them."""
    values = list(found)
    for i in _DATETIMES_AT:
        values[i] = _aware(values[i], connection)
    return row_from_tuple(values)


def _aware(value: datetime | None, connection: Any) -> datetime | None:
    """A datetime as the ORM would return it: the driver returns it naive, in the
    connection's zone."""
    if not settings.USE_TZ or value is None:
        return value
    return connection.ops.convert_datetimefield_value(value, None, connection)
