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


def cursor(connection: Any) -> Any:
    """A Django cursor on ``connection`` (a DatabaseWrapper) for the library's statements."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    options = connection.settings_dict["OPTIONS"]
    if (connection.vendor != "postgresql" or not is_psycopg3
            or options.get("server_side_binding") is True):
        # The project's cursors bind server-side: its prepare_threshold decides for ours
        # too (raising it for ours would prepare its queries as well).
        return connection.cursor()
    from django.db.backends.postgresql import base
    from psycopg.pq import Format

    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    wanted = threshold(options, PREPARE_THRESHOLD)
    if wanted is not None and raw.prepare_threshold is None:
        # Only the library's statements use it: Django's client-binding cursors, which
        # the project's queries run on, never prepare.
        raw.prepare_threshold = wanted
    with connection.wrap_database_errors:
        server_binding = _server_binding_cursor()(raw)
        server_binding.prepared = wanted is not None
        # As Django's create_cursor: its time zone when the connection's disagrees.
        loader = raw.adapters.get_loader(base.TIMESTAMPTZ_OID, Format.TEXT)
        if connection.timezone != loader.timezone:
            base.register_tzloader(connection.timezone, server_binding)
        return connection._prepare_cursor(server_binding)
