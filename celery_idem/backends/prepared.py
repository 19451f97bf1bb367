"""Cursors for the library's statements on PostgreSQL, and whether they are prepared.

A prepared statement is session state: it lives on the server session until the session
ends. Behind a transaction pooler (PgBouncer in ``pool_mode = transaction`` before 1.21,
or without ``max_prepared_statements``) consecutive transactions of one client run on
different server sessions, so a statement prepared on one is missing on the next, or a
name psycopg reuses (``_pg3_0``) already exists on it. So the library prepares nothing
unless the settings ask for it:

- ``CELERY_IDEM_PREPARED_STATEMENTS = True``: the library's statements are prepared (on
  Django's connection from their second use in a session, on the bookkeeping connection,
  which outlives tasks, from their first). The project's own queries are unaffected.
- or the project's connection prepares its own queries (``OPTIONS``
  ``server_side_binding: True`` and an integer ``prepare_threshold``): the library's
  statements follow that choice.

An explicit ``OPTIONS["prepare_threshold"]`` always wins (``None``: nothing is prepared;
with the setting on, system check W007 says the two disagree).

Django's cursors bind parameters client-side by default (``server_side_binding`` off).
The library's statements run on a server-binding cursor of the same session all the
same, wrapped by Django as usual (its error translation, query logging and execute
wrappers still apply): binding is per message and leaves nothing on the session, and it
is what lets a prepared statement be used when they are asked for. psycopg prepares
nothing while the connection's ``prepare_threshold`` is None, Django's default; the
cursor passes ``prepare=False`` when the settings do not ask, whatever the threshold.
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace
from typing import Any

from ..conf import settings

#: On Django's connection, prepare one of our statements on its second use in a session:
#: the first costs no extra round trip, so a connection closed after every task (Celery's
#: fixup as shipped) pays nothing for it.
PREPARE_THRESHOLD = 1


def threshold(options: dict[str, Any], default: int) -> int | None:
    """The psycopg ``prepare_threshold`` for the library's statements on a connection
    with these Django ``OPTIONS`` (None: prepare nothing), ``default`` when the setting
    asks for prepared statements and ``OPTIONS`` do not say."""
    if "prepare_threshold" in options:
        # The project's own: it prepares its queries only if it binds server-side.
        if settings.PREPARED_STATEMENTS or options.get("server_side_binding") is True:
            return options["prepare_threshold"]
        return None
    return default if settings.PREPARED_STATEMENTS else None


@cache
def _server_binding_cursor() -> type:
    from django.db.backends.postgresql import base

    class ServerBindingCursor(base.ServerBindingCursor):
        """Django's server-binding cursor, which prepares only when told to (``prepared``),
        and whose last query Django's query log can read after a prepared execution too
        (psycopg leaves ``_query`` unset then, and ``last_executed_query`` reads it: the
        log would say None)."""

        prepared = False

        def execute(self, query: Any, params: Any = None, **options: Any) -> Any:
            if not self.prepared:
                options["prepare"] = False
            result = super().execute(query, params, **options)
            if getattr(self, "_query", None) is None:
                self._query = SimpleNamespace(query=str(query).encode(), params=None)
            return result

    return ServerBindingCursor


@cache
def _driver() -> tuple[Any, Any] | None:
    """Django's PostgreSQL backend module and psycopg's text format, on psycopg 3 (None
    on psycopg 2). Imported once, on first use: a project without PostgreSQL imports
    this module too, and an import statement per statement costs ~1 µs each."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return None
    from django.db.backends.postgresql import base
    from psycopg.pq import Format

    return base, Format.TEXT


def cursor(connection: Any) -> Any:
    """A Django cursor on ``connection`` (a DatabaseWrapper) for the library's statements,
    to use as ``with cursor(connection) as c``.

    On psycopg 3 the psycopg cursor is kept on the connection and reused by the next
    statement (``_kept``): making one per statement (its adapters map copied, Django's
    time zone check, its close) cost more instructions than a ``SELECT 1`` round trip.
    Django's wrapper is still made per statement, so its error translation, query log
    (``CaptureQueriesContext`` included) and execute wrappers apply as before."""
    if connection.vendor != "postgresql" or _driver() is None:
        return connection.cursor()
    options = connection.settings_dict["OPTIONS"]
    # The project's cursors bind server-side: its prepare_threshold decides for ours
    # too (raising it for ours would prepare its queries as well), on Django's cursor.
    project_binds = options.get("server_side_binding") is True
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    wanted = None if project_binds else threshold(options, PREPARE_THRESHOLD)
    if wanted is not None and raw.prepare_threshold is None:
        # Only the library's statements use it: Django's client-binding cursors, which
        # the project's queries run on, never prepare.
        raw.prepare_threshold = wanted
    with connection.wrap_database_errors:
        kept = _kept(connection, raw, project_binds)
        if not project_binds:
            kept.prepared = wanted is not None
        return _Borrowed(connection._prepare_cursor(kept))


def _kept(connection: Any, raw: Any, project_binds: bool) -> Any:
    """The psycopg cursor kept on ``connection`` for ``raw`` (its live psycopg
    connection), made on first use and again after a reconnect; with the connection's
    time zone, as Django's ``create_cursor`` sets it on each new cursor."""
    driver = _driver()
    assert driver is not None  # cursor() keeps one only on psycopg 3
    base, text = driver
    held = getattr(connection, "_celery_idem_cursor", None)
    if held is not None and held[0] is raw and held[1] is project_binds and not held[2].closed:
        kept = held[2]
    else:
        kept = connection.create_cursor() if project_binds else _server_binding_cursor()(raw)
    # Checked on every use: the connection's time zone can change (override_settings).
    loader = kept.adapters.get_loader(base.TIMESTAMPTZ_OID, text)
    if connection.timezone != loader.timezone:
        base.register_tzloader(connection.timezone, kept)
    # What ``fetch`` checks before it uses the cursor without Django's wrapper.
    connection._celery_idem_cursor = (raw, project_binds, kept, connection.timezone,
                                      connection.settings_dict["OPTIONS"],
                                      settings.PREPARED_STATEMENTS)
    return kept


def fetch(connection: Any, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run one of the library's statements on ``connection`` (a DatabaseWrapper) and
    return its rows.

    Through ``cursor`` (Django's wrapper around the kept cursor) whenever anything may
    want to see it or Django has something to check first: a query log
    (``CaptureQueriesContext``, ``DEBUG``), an execute wrapper, a transaction to refuse,
    a health check due, no kept cursor yet or one made for other settings (time zone,
    ``OPTIONS``, ``PREPARED_STATEMENTS``). Otherwise the kept cursor runs it directly,
    Django's errors still translated: the wrapper and the cursor's checks cost about
    60,000 instructions a statement, a third of a claim's."""
    held = getattr(connection, "_celery_idem_cursor", None)
    if (held is None or held[0] is not connection.connection or held[2].closed
            or held[3] is not connection.timezone
            or held[4] is not connection.settings_dict["OPTIONS"]
            or held[5] is not settings.PREPARED_STATEMENTS
            or connection.execute_wrappers or connection.needs_rollback
            or connection.queries_logged
            or (connection.health_check_enabled and not connection.health_check_done)):
        with cursor(connection) as slow:
            slow.execute(sql, params)
            return list(slow.fetchall())
    kept = held[2]
    with connection.wrap_database_errors:
        kept.execute(sql, params)
        return kept.fetchall()


class _Borrowed:
    """``with`` on a kept cursor: yields Django's wrapper and leaves the cursor open for
    the next statement (the wrapper's own ``__exit__`` would close it)."""

    __slots__ = ("wrapper",)

    def __init__(self, wrapper: Any) -> None:
        self.wrapper = wrapper

    def __enter__(self) -> Any:
        return self.wrapper

    def __exit__(self, *exc: object) -> None:
        return None
