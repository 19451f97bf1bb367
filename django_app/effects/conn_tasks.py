"""Tasks the worker-connection tests run (tests/integration/test_worker_connections.py).

Not autodiscovered: the tests start their workers with ``-I django_app.effects.conn_tasks``.
Each reports which pool child ran it and which PostgreSQL backend served it.
"""

from __future__ import annotations

import os

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.db import connection


def _where() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    return {"child": os.getpid(), "backend": backend}


@shared_task(name="conn.where")
def where() -> dict[str, int]:
    """The child's pid and the backend pid of Django's connection."""
    return _where()


@shared_task(name="conn.sleep_soft", soft_time_limit=1)
def sleep_soft(seconds: float) -> dict[str, int | str]:
    """A query the soft time limit interrupts mid-flight; the body catches the exception and
    returns, so the task succeeds with the connection still waiting for its result."""
    where = _where()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(%s)", [seconds])
    except SoftTimeLimitExceeded:
        return {**where, "interrupted": "soft"}
    return {**where, "interrupted": "no"}


@shared_task(name="conn.sleep_soft_raises", soft_time_limit=1)
def sleep_soft_raises(seconds: float) -> None:
    """The same query, the time limit's exception left to fail the task."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [seconds])


@shared_task(name="conn.sleep_hard", time_limit=1)
def sleep_hard(seconds: float) -> None:
    """A query the hard time limit interrupts: the pool kills the child."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [seconds])
