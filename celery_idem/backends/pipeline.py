"""Two statements in one round trip (PostgreSQL, psycopg 3's pipeline mode).

**An atomic body's last statement and its COMMIT.** ``atomic=True`` ends its transaction
with the commit move (the fenced ``succeeded`` write), then Django's COMMIT at the block's
exit: two round trips, the second only waiting for the first to say the fence held.
Pipeline mode sends both at once if losing the fence fails the statement itself
(``move_result_final`` in postgresql.sql): the server then skips the COMMIT queued behind
it, and the block's exit rolls back. Only where the block's exit would have committed:
the outermost ``atomic()`` on the connection, committing on exit, not already doomed.
Django's exit then finds no transaction open (psycopg sends nothing for a commit then)
and runs the ``on_commit`` callbacks as usual. Anywhere else (a savepoint inside the
caller's transaction, psycopg 2, a libpq without pipeline mode) the move runs alone and
the block commits as before.

**A bookkeeping write whose commit does not wait for the WAL flush.** On the bookkeeping
connection (autocommit) a claim or a commit is sent after
``set_config('synchronous_commit', 'off', true)``, both before one Sync: the server runs
the messages up to a Sync in one implicit transaction, which the Sync commits, so the
setting covers that commit and ends with it. Nothing stays on the session (a transaction
pooler may hand it to another client next), and it costs no round trip. A statement
with a stored routine (``routines``) needs neither: the routine sets it first thing, in
the same transaction, so the call is sent alone (a pipeline costs the client about three
times a plain execute).

**A savepoint around a statement.** An intent in the caller's transaction has a
savepoint of its own, which Django's ``atomic()`` creates and releases in two round trips
more. ``fetch_together`` queues ``SAVEPOINT`` and ``RELEASE SAVEPOINT`` around the
statement before one Sync: one round trip, the statement's parameters still bound
server-side (a prepared statement, when asked for, stays possible). A statement that
fails makes the server skip the rest up to the Sync; the savepoint is then rolled back
to, and the caller's transaction stays usable. (An atomic body's claim is not sent with
the BEGIN psycopg sends alone before it: that saves a round trip but costs the client
about 160,000 instructions of pipeline mode, and end to end it did not pay; see
docs/decisions/2026-11-28-no-pipelined-begin.md.)
"""

from __future__ import annotations

from functools import cache
from typing import Any

from . import prepared

#: Sent before a bookkeeping write, in its transaction: that commit only is unflushed.
UNFLUSHED_COMMIT = "SELECT set_config('synchronous_commit', 'off', true)"


def supported() -> bool:
    """Whether psycopg 3's pipeline mode is there (psycopg 2 and an old libpq have none)."""
    return _supported()


@cache
def _supported() -> bool:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return False
    from psycopg import Pipeline

    return bool(Pipeline.is_supported())


def commits_at_exit(connection: Any) -> bool:
    """Whether ``connection`` (a DatabaseWrapper) is in one ``atomic()`` block whose exit
    commits: its last statement may commit with it."""
    return (connection.vendor == "postgresql" and connection.in_atomic_block
            and len(connection.atomic_blocks) == 1 and connection.commit_on_exit
            and not connection.needs_rollback and _supported())


def execute_and_commit(connection: Any, sql: str, params: dict[str, Any]) -> None:
    """Run ``sql`` (through ``prepared.cursor``) and COMMIT, in one round trip.
    A failing statement makes the server skip the COMMIT; its error is raised (as
    Django's), the transaction left for the block's exit to roll back."""
    with connection.wrap_database_errors, prepared.cursor(connection) as cursor:
        # Both queued, then one Sync at the pipeline's exit. (``raw.commit()`` would
        # sync after the COMMIT, and the exit once more: a second round trip.)
        with connection.connection.pipeline():
            cursor.execute(sql, params)
            cursor.cursor.execute("COMMIT", prepare=False)


#: The savepoint ``fetch_together`` puts around a statement.
SAVEPOINT = "celery_idem_write"


def fetch_together(connection: Any, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run ``sql`` on ``connection`` (in the caller's ``atomic()``) inside a savepoint of
    its own, and return its rows: the three statements in one round trip."""
    with connection.wrap_database_errors, prepared.cursor(connection) as cursor:
        raw = connection.connection
        try:
            with raw.pipeline():
                cursor.cursor.execute(f"SAVEPOINT {SAVEPOINT}", prepare=False)
                cursor.execute(sql, params)
                # On a cursor of its own: the statement's rows stay.
                raw.execute(f"RELEASE SAVEPOINT {SAVEPOINT}", prepare=False)
        except Exception:
            _roll_back_to_savepoint(connection)
            raise
        return list(cursor.fetchall())


def _roll_back_to_savepoint(connection: Any) -> None:
    """After ``fetch_together``'s statement failed: back to the savepoint, so the
    caller's transaction goes on; if even that fails (the connection is gone), the
    transaction can only roll back, as Django's ``atomic()`` marks it."""
    raw = connection.connection
    try:
        with raw.pipeline():
            raw.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}", prepare=False)
            raw.execute(f"RELEASE SAVEPOINT {SAVEPOINT}", prepare=False)
    except Exception:
        connection.needs_rollback = True


def fetch_unflushed(connection: Any, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run ``sql`` on ``connection`` (a DatabaseWrapper in autocommit: the caller checks)
    and return its rows; its commit does not wait for the WAL flush. Where pipeline mode is
    missing (psycopg 2, an old libpq), the statement runs alone, its commit flushed."""
    with connection.wrap_database_errors, prepared.cursor(connection) as cursor:
        raw = connection.connection
        if not _supported():
            cursor.execute(sql, params)
            return list(cursor.fetchall())
        with raw.pipeline():
            # On the statement's own cursor, whose results are then the statement's (the
            # last executed): ``raw.execute`` would make a cursor for it on every write.
            cursor.cursor.execute(UNFLUSHED_COMMIT, prepare=False)
            cursor.execute(sql, params)
        # Fetched after the pipeline's Sync: fetching inside it would cost a round trip.
        return list(cursor.fetchall())


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a Django database error raised from psycopg's."""
    return getattr(error.__cause__, "sqlstate", None)
