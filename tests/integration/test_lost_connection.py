"""A body whose database session is killed under it is handed back like a crash, not
failed, with real workers: on PostgreSQL (``pg_terminate_backend`` of the body's
backend), behind PgBouncer (its console's ``KILL`` of the database) and on MariaDB
(``KILL`` of the body's connection). Only the body's own errors make a key FAILED: a
cancelled query leaves the connection working, and fails the job.

Each body records its effect, writes its connection's id to ``<name>.started``, waits
for the file ``<name>`` and then queries: the session is killed in between.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from celery_idem import InProgress, StoredFailure
from celery_idem.models import Job, Transition
from django_app.effects.models import Effect
from django_app.effects.tasks import (
    query_after_hold,
    query_after_hold_atomic,
    query_after_hold_once,
    query_after_hold_uncertain,
    sleep_in_body,
)
from tests.services import pgbouncer

from .workers import Worker, wait_until, worker_env

TIMEOUT = 120

pytestmark = pytest.mark.skipif(settings.DATABASE_KIND == "sqlite",
                                reason="a SQLite file has no session to kill")


def kill_session(session: int) -> None:
    """End the body's session on the server, from this process's own connection."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"KILL CONNECTION {int(session)}")
        else:
            cursor.execute("SELECT pg_terminate_backend(%s)", [session])


def cancel_query(session: int) -> None:
    """Interrupt the statement the body's session runs; the session stays."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"KILL QUERY {int(session)}")
        else:
            cursor.execute("SELECT pg_cancel_backend(%s)", [session])


def started(folder: Path, name: str) -> int:
    path = folder / f"{name}.started"
    return int(path.read_text()) if path.exists() and path.read_text() else 0


def run_killed(task, name: str, folder: Path, kill: Callable[[int], None]):
    """Send ``task``, kill its session while it holds, let it go on; its AsyncResult."""
    sent = task.delay(name, str(folder))
    session = wait_until(lambda: started(folder, name), TIMEOUT, what="the body to hold")
    kill(session)
    (folder / name).touch()
    return sent


#: Behind a transaction pooler a plain body holds a server session only while a statement
#: runs, so the session it reported is not its own afterwards (an atomic body's
#: transaction keeps its session): there the pooler's own KILL is the test.
own_session = pytest.mark.skipif(
    settings.PGBOUNCER, reason="behind a transaction pooler: see the PgBouncer KILL test")


def history(job: Job) -> list[tuple[str, int]]:
    return list(Transition.objects.filter(job=job).order_by("id")
                .values_list("event", "attempt"))


@pytest.fixture
def worker(broker_service, transactional_db) -> Iterator[Worker]:
    with Worker(concurrency=1) as w:
        yield w


@own_session
def test_a_plain_body_whose_session_is_killed_runs_again(worker, tmp_path):
    """Attempt 1's session is killed mid-body: its claim is released (not FAILED), the
    message comes back and attempt 2 succeeds; the effect attempt 1 committed before
    the kill stays, as after any crash between the effect and the commit."""
    sent = run_killed(query_after_hold, "plain", tmp_path, kill_session)
    assert sent.get(timeout=TIMEOUT) == {"effects": 2, "attempt": 2}
    job = Job.objects.get(key="lost/plain")
    assert job.state == "SUCCEEDED" and job.attempt == 2
    released = Transition.objects.get(job=job, event="released")
    assert released.attempt == 1
    assert released.reason.startswith("the body lost its database connection")
    assert "failed" not in [event for event, _ in history(job)]


def test_an_atomic_body_whose_session_is_killed_runs_again_once(worker, tmp_path):
    """Nothing of attempt 1 was committed: the rolled-back attempt is recorded (released,
    counted against max_attempts), and the body runs again: one effect, SUCCEEDED."""
    sent = run_killed(query_after_hold_atomic, "atomic", tmp_path, kill_session)
    result = sent.get(timeout=TIMEOUT)
    assert result["effects"] == 1
    job = Job.objects.get(key="lost-atomic/atomic")
    assert job.state == "SUCCEEDED" and job.attempt == result["attempt"] == 2
    assert history(job) == [("released", 1)]
    assert Effect.objects.filter(key="lost-atomic/atomic").count() == 1


@own_session
def test_a_task_that_must_not_rerun_blindly_ends_uncertain(worker, tmp_path):
    """The same rule as a lost worker: a task declared on_stale_claim="uncertain" is
    not run again; the caller is told an operator decides."""
    sent = run_killed(query_after_hold_uncertain, "u", tmp_path, kill_session)
    with pytest.raises(InProgress, match="UNCERTAIN"):
        sent.get(timeout=TIMEOUT)
    job = Job.objects.get(key="lost-uncertain/u")
    assert job.state == "UNCERTAIN" and job.attempt == 1
    assert Effect.objects.filter(key="lost-uncertain/u").count() == 1


@own_session
def test_a_lost_connection_counts_against_max_attempts(worker, tmp_path):
    """With max_attempts 1, the attempt whose session was killed used the budget: the
    key is dead-lettered, not run a second time."""
    sent = run_killed(query_after_hold_once, "budget", tmp_path, kill_session)
    with pytest.raises(StoredFailure, match="DeadLettered"):
        sent.get(timeout=TIMEOUT)
    job = Job.objects.get(key="lost-once/budget")
    assert job.state == "FAILED" and job.dead_lettered and job.attempt == 1
    assert Effect.objects.filter(key="lost-once/budget").count() == 1


def test_a_cancelled_query_is_the_bodys_own_error(worker, tmp_path):
    """The session stays, only its statement is interrupted: the body's error, FAILED."""
    sent = sleep_in_body.delay("cancel", str(tmp_path))
    session = wait_until(lambda: started(tmp_path, "cancel"), TIMEOUT,
                         what="the body's query to start")
    wait_until(lambda: sleeping(session), TIMEOUT, what="the query to run")
    cancel_query(session)
    with pytest.raises(Exception) as raised:
        sent.get(timeout=TIMEOUT)
    assert type(raised.value).__name__ == "OperationalError"
    job = Job.objects.get(key="sleep/cancel")
    assert job.state == "FAILED" and job.error["type"] == "OperationalError"


def sleeping(session: int) -> bool:
    """Whether the body's session runs its sleep right now."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SELECT count(*) FROM information_schema.PROCESSLIST "
                           "WHERE ID = %s AND INFO LIKE 'SELECT SLEEP%%'", [session])
        else:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s "
                           "AND state = 'active' AND query LIKE 'SELECT pg_sleep%%'",
                           [session])
        return bool(cursor.fetchone()[0])


@pytest.mark.skipif(settings.DATABASE_KIND != "postgres" or pgbouncer.binary() is None,
                    reason="a private PgBouncer in front of PostgreSQL")
@pytest.mark.parametrize("task", [query_after_hold, query_after_hold_atomic],
                         ids=["plain", "atomic"])
def test_a_pgbouncer_kill_under_a_running_body_runs_it_again(
        task, broker_service, transactional_db, tmp_path):
    """The worker connects through its own PgBouncer (transaction pooling); its console's
    ``KILL`` drops every client and server connection of the database under the body
    (``database removed``), ``RESUME`` lets new ones in: the key runs again, SUCCEEDED."""
    upstream = int(settings.PG_DIRECT_PORT if settings.PGBOUNCER
                   else connection.settings_dict["PORT"])
    name = str(connection.settings_dict["NAME"])
    with pgbouncer.running(upstream_port=upstream) as bouncer:
        env = worker_env(**pgbouncer.environment(bouncer))
        with Worker(concurrency=1, env=env):

            def kill(_session: int) -> None:
                bouncer.admin(f"KILL {name}")
                bouncer.admin(f"RESUME {name}")

            sent = run_killed(task, "bouncer", tmp_path, kill)
            result = sent.get(timeout=TIMEOUT)
    job = Job.objects.get(key=f"{'lost-atomic' if task.atomic else 'lost'}/bouncer")
    assert job.state == "SUCCEEDED" and result["attempt"] == job.attempt == 2
    assert Transition.objects.get(job=job, event="released").attempt == 1
    assert Effect.objects.filter(key=job.key).count() == (1 if task.atomic else 2)

