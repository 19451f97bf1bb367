"""The worker's bookkeeping survives a dropped connection, with real workers."""

from __future__ import annotations

import sqlite3
import uuid
from contextlib import closing

import pytest
from django.conf import settings
from django.db import connection

from celery_idem.models import Job, Transition
from django_app.effects.models import Effect
from django_app.effects.tasks import deduct_stock, ship_order, wait_for_file

from .workers import Worker, wait_until, worker_env

TIMEOUT = 120


def _write_lock_held() -> bool:
    """Whether another connection holds SQLite's write lock (a writer's transaction)."""
    with closing(sqlite3.connect(connection.settings_dict["NAME"], timeout=0)) as probe:
        try:
            probe.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return True
        probe.rollback()
        return False


def terminate(application_name: str) -> int:
    """End every PostgreSQL session of that application name (only the worker's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE application_name = %s AND pid <> pg_backend_pid()",
                       [application_name])
        return int(cursor.fetchone()[0])


@pytest.mark.skipif(settings.DATABASE_KIND != "postgres", reason="PostgreSQL sessions")
def test_worker_connections_terminated_mid_body_commit_on_a_fresh_one(
        tmp_path, broker_service, transactional_db):
    """While a non-atomic body runs, every connection of the worker is terminated: its
    commit is tried again on a fresh connection: one effect, SUCCEEDED, caller answered."""
    name = f"idem-{uuid.uuid4().hex[:8]}"
    env = worker_env(IDEM_PG_APPLICATION_NAME=name)
    with Worker(concurrency=1, env=env) as w:
        sent = wait_for_file.delay("drop", str(tmp_path))
        wait_until(lambda: Effect.objects.filter(key="wait/drop").exists(), TIMEOUT,
                   what="the effect")
        assert terminate(name) >= 1
        (tmp_path / "drop").touch()
        assert sent.get(timeout=TIMEOUT) == "drop"
        assert "trying again on a fresh connection" in w.log()  # the commit did drop
    job = Job.objects.get(key="wait/drop")
    assert job.state == "SUCCEEDED" and job.attempt == 1
    assert Effect.objects.filter(key="wait/drop").count() == 1
    # One commit landed, nothing else: no late finish, no second attempt (the happy
    # path writes no history rows).
    assert not Transition.objects.filter(job=job).exists()


@pytest.mark.skipif(settings.DATABASE_KIND != "sqlite", reason="SQLite's locking")
def test_sqlite_on_django_defaults_a_long_atomic_task_leaves_nothing_running(
        broker_service, transactional_db):
    """No WAL, a 5 s busy timeout: a 7 s atomic body holds the write lock while short
    tasks claim and commit beside it; their bookkeeping waits and tries again.

    The short tasks are sent once the long one holds the lock: one that claimed before
    it would run its body's own write under the lock, and Django's 5 s timeout fails
    that write (the body's error, the application's to handle; checks W003-W005 warn
    about these settings)."""
    with connection.cursor() as cursor:  # journal_mode is kept in the file: undo WAL
        cursor.execute("PRAGMA journal_mode=DELETE")
    try:
        env = worker_env(IDEM_SQLITE_DJANGO_DEFAULTS="1")
        with Worker(concurrency=3, env=env):
            long = deduct_stock.delay(1, 1, 1, hold=7.0)
            wait_until(_write_lock_held, TIMEOUT, interval=0.02,
                       what="the atomic task to hold the write lock")
            short = [ship_order.delay(n) for n in range(4)]
            assert long.get(timeout=TIMEOUT)["deducted"] == 1
            assert [r.get(timeout=TIMEOUT)["shipped"] for r in short] == [0, 1, 2, 3]
            wait_until(lambda: not Job.objects.exclude(state="SUCCEEDED").exists(), TIMEOUT,
                       what="every job finished")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")
    assert Effect.objects.filter(key__startswith="ship/").count() == 4
    assert Effect.objects.filter(key__startswith="deduct/").count() == 1
