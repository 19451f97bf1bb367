"""The job database gone during the claim and during an atomic body's commit, with a
real worker (docs/explanation/reliability.md, "Bad inputs"): the message waits and comes back, the
body's effect happens once, nothing is lost.

"Gone" here: the worker's sessions are terminated and the database refuses new
connections (``ALLOW_CONNECTIONS false``) until the test lets them in again. Only this
run's test database is touched, and only the worker's sessions are ended.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from celery_idem.connection import bookkeeping_connection, release_bookkeeping
from celery_idem.models import Job
from django_app.effects.models import Effect
from django_app.effects.tasks import ship_order, wait_for_file_atomic

from .workers import Worker, wait_until, worker_env

TIMEOUT = 120

pytestmark = pytest.mark.skipif(settings.DATABASE_KIND != "postgres",
                                reason="ends PostgreSQL sessions and refuses connections")


def _as_maintenance(*statements: tuple[str, list[str]]) -> None:
    """Run statements from the server's ``postgres`` database: a database cannot refuse
    connections to itself from one of its own sessions."""
    import psycopg

    params = connection.settings_dict
    with psycopg.connect(host=params["HOST"], port=params["PORT"], user=params["USER"],
                         dbname="postgres", autocommit=True) as maintenance:
        for sql, args in statements:
            maintenance.execute(sql, args)


@contextmanager
def database_gone(application_name: str) -> Iterator[None]:
    """The worker cannot reach the job database inside the block. This process keeps
    its open sessions, so it opens them first: Django's, and the bookkeeping connection
    its producer writes intents on outside a transaction (it publishes while the
    database is gone)."""
    connection.ensure_connection()
    bookkeeping_connection(connection.alias).ensure_connection()
    release_bookkeeping()  # idle, still open: the next publish takes it
    name = connection.ops.quote_name(str(connection.settings_dict["NAME"]))
    _as_maintenance(
        (f"ALTER DATABASE {name} ALLOW_CONNECTIONS false", []),
        ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
         "WHERE application_name = %s", [application_name]))
    try:
        yield
    finally:
        _as_maintenance((f"ALTER DATABASE {name} ALLOW_CONNECTIONS true", []))


@pytest.fixture
def worker_named(broker_service, transactional_db) -> Iterator[tuple[Worker, str]]:
    name = f"idem-{uuid.uuid4().hex[:8]}"
    with Worker(concurrency=1, env=worker_env(IDEM_PG_APPLICATION_NAME=name)) as w:
        yield w, name


def test_a_database_gone_at_the_claim_delays_the_job_and_loses_nothing(worker_named):
    """The claim cannot reach the database: the worker re-queues the message
    (PersistenceError, a wait) without running the body; once the database is back the
    job runs once and the caller gets its result."""
    w, name = worker_named
    with database_gone(name):
        sent = ship_order.delay(1201)
        wait_until(lambda: "PersistenceError" in w.log(), TIMEOUT,
                   what="the claim to fail on the missing database")
        assert not Effect.objects.filter(key="ship/1201").exists()
    assert sent.get(timeout=TIMEOUT) == {"shipped": 1201, "attempt": 1}
    assert Effect.objects.filter(key="ship/1201").count() == 1
    assert Job.objects.get(key="ship/1201").state == "SUCCEEDED"


def test_a_database_gone_during_an_atomic_commit_rolls_back_and_runs_once(
        worker_named, tmp_path: Path):
    """An atomic body is running when the database goes: its transaction (claim, effect,
    commit) is lost with the connection, the message is re-queued, and once the database
    is back the body runs again: one effect, SUCCEEDED, the caller answered."""
    w, name = worker_named
    sent = wait_for_file_atomic.delay("gone", str(tmp_path))
    wait_until(lambda: (tmp_path / "gone.started").exists(), TIMEOUT,
               what="the atomic body to start")
    with database_gone(name):
        (tmp_path / "gone").touch()  # the body returns; its commit meets no database
        wait_until(lambda: "PersistenceError" in w.log(), TIMEOUT,
                   what="the commit to fail on the missing database")
    assert sent.get(timeout=TIMEOUT) == "gone"
    assert Effect.objects.filter(key="wait-atomic/gone").count() == 1
    assert Job.objects.get(key="wait-atomic/gone").state == "SUCCEEDED"
