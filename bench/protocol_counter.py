"""What bench/protocol_cost.py counts in a block: SQL statements as Django's query log
sees them and network round trips as libpq sees them, on every connection the plugin may
use. Apart from the paths it counts (protocol_paths.py), so a path reads as what it runs.
"""

from __future__ import annotations

import os
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any


class Counter:
    """Statements (Django's query log) and round trips (libpq trace) within a block."""

    def __init__(self) -> None:
        self.statements: list[str] = []
        self.round_trips = 0
        self.elapsed_us = 0.0
        self.per_connection: dict[str, dict[str, int]] = {}

    def as_dict(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for sql in self.statements:
            kinds[_kind(sql)] = kinds.get(_kind(sql), 0) + 1
        return {"statements": len(self.statements), "round_trips": self.round_trips,
                "per_connection": self.per_connection,
                "by_kind": kinds, "elapsed_us": round(self.elapsed_us, 1),
                "sql": [s[:160] for s in self.statements]}


def _kind(sql: str) -> str:
    s = sql.lstrip().upper()
    if s.startswith("WITH"):
        # a data-modifying CTE: name it by its first write
        for word in ("INSERT", "UPDATE", "DELETE"):
            if word in s:
                return f"WITH..{word}"
        return "WITH..SELECT"
    return s.split(None, 1)[0] if s else "?"


def _connections() -> list[tuple[str, Any]]:
    """Django's connection, and the plugin's dedicated bookkeeping connection if it has
    one (celery_idem.connection: default-mode claims and commits in a worker)."""
    from django.db import connection

    found = [("django", connection)]
    try:
        from celery_idem.connection import bookkeeping_connection
    except ImportError:
        return found
    found.append(("dedicated", bookkeeping_connection("default")))
    return found


@contextmanager
def count() -> Any:
    """Statements and round trips on every connection the plugin may use."""
    from django.test.utils import CaptureQueriesContext

    result = Counter()
    with ExitStack() as stack:
        captures, traces = [], []
        for label, conn in _connections():
            capture = stack.enter_context(CaptureQueriesContext(conn))
            captures.append((label, capture))
            pgconn = conn.connection.pgconn
            fd, path = tempfile.mkstemp(prefix="libpq-trace-")
            pgconn.trace(fd)
            traces.append((label, pgconn, fd, path))
        started = time.perf_counter()
        try:
            yield result
        finally:
            result.elapsed_us = 1e6 * (time.perf_counter() - started)
            texts = {}
            for label, pgconn, fd, path in traces:
                pgconn.untrace()
                os.close(fd)
                texts[label] = Path(path).read_text(errors="replace")
                os.unlink(path)
    result.statements = [q["sql"] for _, cap in captures for q in cap.captured_queries]
    result.per_connection = {
        label: {"statements": len(cap.captured_queries),
                "round_trips": sum(1 for line in texts[label].splitlines()
                                   if "ReadyForQuery" in line)}
        for label, cap in captures}
    result.round_trips = sum(v["round_trips"] for v in result.per_connection.values())
