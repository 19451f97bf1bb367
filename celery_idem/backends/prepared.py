"""Cursors for the library's statements on Django's own PostgreSQL connection, prepared.

Atomic mode and the outbox run the job statements on Django's connection (they share the
caller's transaction). Django gives psycopg ``prepare_threshold=None`` unless told
otherwise, and psycopg then prepares nothing, ``prepare=True`` included
(``psycopg._preparing.PrepareManager.get`` returns ``Prepare.NO`` first thing when the
threshold is None). And Django's cursors bind client-side by default
(``server_side_binding`` off): psycopg's ``ClientCursor`` never prepares either.

So, on such a connection (the default), our statements run on a server-binding cursor of
the same session, wrapped by Django as usual (its error translation, query logging and
execute wrappers still apply), and the raw connection's threshold is set to 1: psycopg
prepares a statement on its second use in a session. The first use costs no extra round
trip, so a connection closed after every task (Celery's fixup as shipped) pays nothing;
a kept one (``CELERY_IDEM_WORKER_CONNECTIONS = "keep"``) plans each statement once. The
project's own queries are unaffected: they go through Django's client-binding cursors,
which never prepare. A project that turned ``server_side_binding`` on, or set
``prepare_threshold`` in its ``OPTIONS`` (``None``: prepare nothing, as a PgBouncer in
transaction mode before 1.21 needs), has chosen, and our statements follow its choice
through Django's plain cursor.
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace
from typing import Any

#: Prepare one of our statements on its second execution in a session.
PREPARE_THRESHOLD = 1


@cache
def _server_binding_cursor() -> type:
    from django.db.backends.postgresql import base

    class ServerBindingCursor(base.ServerBindingCursor):
        """Django's server-binding cursor, whose last query Django's query log can read
        after a prepared execution too (psycopg leaves ``_query`` unset then, and
        ``last_executed_query`` reads it: the log would say None)."""

        def execute(self, query: Any, params: Any = None, **options: Any) -> Any:
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
            or options.get("server_side_binding") is True or "prepare_threshold" in options):
        return connection.cursor()
    from django.db.backends.postgresql import base
    from psycopg.pq import Format

    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = PREPARE_THRESHOLD
    with connection.wrap_database_errors:
        server_binding = _server_binding_cursor()(raw)
        # As Django's create_cursor: its time zone when the connection's disagrees.
        loader = raw.adapters.get_loader(base.TIMESTAMPTZ_OID, Format.TEXT)
        if connection.timezone != loader.timezone:
            base.register_tzloader(connection.timezone, server_binding)
        return connection._prepare_cursor(server_binding)
