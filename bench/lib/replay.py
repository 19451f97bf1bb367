"""The library's statements sent again through the bare driver: the floor of a path.

``capture(ops)`` runs each operation with an execute wrapper on every connection the
library may use and keeps, per operation, the statements that name its tables or
routines (``celery_idem``), with their parameters, connection and whether they ran in a
transaction. ``replayer(captured)`` returns a loop that sends exactly those statements
again, in the same transactions (a statement outside one autocommitted, as the library
sends it), on the same connections' driver objects, without Django or the library: a
psycopg cursor binding server-side (as the library's), MySQLdb's cursor, SQLite's
connection with the text Django would have converted. The database must be back in the
state it was in when they were captured (``bench.lib.common.reset_tables`` and the same
preparation). What a path costs above that loop is the library's own Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: A statement: its text, parameters, and whether it failed (a key that exists, on
#: MariaDB: the library catches the error, and so does the replay).
Statement = tuple[str, Any, bool]
Group = tuple[str, bool, list[Statement]]  # connection label, in a transaction, statements


def capture(ops: list[Callable[[], Any]]) -> list[list[Group]]:
    """Run ``ops``; the library's statements of each, grouped by transaction."""
    from bench.lib.counting import connections_in_use

    out: list[list[Group]] = []
    for op in ops:
        seen: list[tuple[str, bool, str, Any, list[bool]]] = []
        wrappers = connections_in_use()

        def wrap(label: str, wrapper: Any) -> Callable[..., Any]:
            def observe(execute: Callable[..., Any], sql: str, params: Any, many: bool,
                        context: Any) -> Any:
                if "celery_idem" not in sql:
                    return execute(sql, params, many, context)
                kept = dict(params) if isinstance(params, dict) else (
                    list(params) if params is not None else None)
                failed: list[bool] = []
                seen.append((label, wrapper.in_atomic_block, sql, kept, failed))
                try:
                    return execute(sql, params, many, context)
                except Exception:
                    failed.append(True)
                    raise
            return observe

        installed = []
        for label, wrapper in wrappers.items():
            fn = wrap(label, wrapper)
            wrapper.execute_wrappers.append(fn)
            installed.append((wrapper, fn))
        try:
            op()
        finally:
            for wrapper, fn in installed:
                wrapper.execute_wrappers.remove(fn)
        groups: list[Group] = []
        for label, atomic, sql, params, failed in seen:
            statement = (sql, params, bool(failed))
            if groups and atomic and groups[-1][1] and groups[-1][0] == label:
                groups[-1][2].append(statement)
            else:
                groups.append((label, atomic, [statement]))
        out.append(groups)
    return out


def _final(sql: str) -> bool:
    """The last write of an atomic body, which the library sends with the COMMIT."""
    return "succeed_final" in sql or "1 / count(*)" in sql


def replayer(captured: list[list[Group]]) -> Callable[[], None]:
    """A loop sending ``captured`` again through the bare drivers (see the module)."""
    from django.db import connection

    from bench.lib.counting import connections_in_use

    wrappers = connections_in_use()
    for wrapper in wrappers.values():
        wrapper.ensure_connection()
    vendor = connection.vendor
    if vendor == "postgresql":
        return _postgres(captured, wrappers)
    if vendor == "mysql":
        return _mysql(captured, wrappers)
    return _sqlite(captured, wrappers)


def _postgres(captured: list[list[Group]], wrappers: dict[str, Any]) -> Callable[[], None]:
    import psycopg

    cursors = {label: psycopg.Cursor(w.connection) for label, w in wrappers.items()}
    raws = {label: w.connection for label, w in wrappers.items()}

    def loop() -> None:
        for groups in captured:
            for label, atomic, statements in groups:
                cursor = cursors[label]
                if not atomic:
                    for sql, params, failed in statements:
                        try:
                            cursor.execute(sql, params, prepare=False)
                        except psycopg.Error:
                            if not failed:
                                raise
                            continue
                        cursor.fetchall()
                    continue
                cursor.execute("BEGIN", prepare=False)
                *body, (last, params, _) = statements
                for sql, p, _ in body:
                    cursor.execute(sql, p, prepare=False)
                    cursor.fetchall()
                if _final(last):
                    with raws[label].pipeline():
                        cursor.execute(last, params, prepare=False)
                        cursor.execute("COMMIT", prepare=False)
                else:
                    cursor.execute(last, params, prepare=False)
                    cursor.fetchall()
                    cursor.execute("COMMIT", prepare=False)
    return loop


def _mysql(captured: list[list[Group]], wrappers: dict[str, Any]) -> Callable[[], None]:
    raw = wrappers["django"].connection
    cursor = raw.cursor()
    error = type(raw).Error if hasattr(type(raw), "Error") else Exception

    def loop() -> None:
        for groups in captured:
            for _, atomic, statements in groups:
                if atomic:
                    raw.autocommit(False)
                for sql, params, failed in statements:
                    if failed:
                        try:
                            cursor.execute(sql, params)
                        except error:
                            continue
                    else:
                        cursor.execute(sql, params)
                    cursor.fetchall()
                if atomic:
                    raw.commit()
                    raw.autocommit(True)
    return loop


def _sqlite(captured: list[list[Group]], wrappers: dict[str, Any]) -> Callable[[], None]:
    from django.db.backends.sqlite3.base import SQLiteCursorWrapper

    wrapper = wrappers["django"]
    raw = wrapper.connection
    begin = f"BEGIN {wrapper.transaction_mode or ''}".strip()

    def converted(sql: str, params: Any) -> str:
        names = list(params) if isinstance(params, dict) else None
        return SQLiteCursorWrapper.convert_query(None, sql, param_names=names)  # type: ignore[arg-type]

    ready = [[(atomic, [(converted(sql, p), p, failed) for sql, p, failed in statements])
              for _, atomic, statements in groups] for groups in captured]
    import sqlite3

    def loop() -> None:
        for groups in ready:
            for atomic, statements in groups:
                if atomic:
                    raw.execute(begin)
                for sql, params, failed in statements:
                    if failed:
                        try:
                            raw.execute(sql, params or ()).fetchall()
                        except sqlite3.Error:
                            pass
                        continue
                    raw.execute(sql, params or ()).fetchall()
                if atomic:
                    raw.execute("COMMIT")
    return loop
