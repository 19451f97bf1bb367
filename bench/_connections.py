"""Django's connections in a benchmark process: all closed (the library's bookkeeping ones
too), or pointed at the PostgreSQL server itself for a block when the run goes through
PgBouncer."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def close_django_connections() -> None:
    try:
        from django.db import connections

        from celery_idem import connection

        connections.close_all()
        connection.close_bookkeeping_connections()
    except Exception:  # noqa: BLE001 - Django never set up: nothing open
        pass


@contextmanager
def direct_connections() -> Iterator[None]:
    """Django's connections to the server itself for the block (behind PgBouncer: the
    migrations, as tests/conftest.py runs them), through the pooler again after."""
    pooler = os.environ.get("IDEM_PGBOUNCER") == "1" and os.environ.get("IDEM_PG_PORT")
    if not pooler:
        yield
        return
    from django.db import connections

    def point_at(port: str) -> None:
        close_django_connections()
        for conn in connections.all():
            conn.settings_dict["PORT"] = port

    point_at(os.environ.get("IDEM_PG_DIRECT_PORT", "5432"))
    try:
        yield
    finally:
        point_at(pooler)
