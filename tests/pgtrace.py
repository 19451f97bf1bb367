"""Round trips to PostgreSQL, counted in psycopg's libpq trace (deterministic, unlike
timings): one ReadyForQuery from the server per query, or per Sync in pipeline mode."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any


def round_trips(connection: Any, fn: Callable[[], Any]) -> int:
    """Round trips on ``connection`` (a Django DatabaseWrapper) while ``fn`` runs (after
    the process's one read of which stored routines the database has)."""
    from celery_idem.backends import routines

    routines.calls(connection)
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        try:
            fn()
        finally:
            pgconn.untrace()
        trace.seek(0)
        return sum("ReadyForQuery" in line for line in trace)
