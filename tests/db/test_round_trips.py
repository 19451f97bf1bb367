"""Database round trips per protocol path, counted (deterministic, unlike timings).

On PostgreSQL each step is one statement: publish 1, fresh run 2 (claim, commit), replay
of a finished key 1. The portable backend spends more statements; its counts are pinned
so a regression shows.
"""

from __future__ import annotations

from contextlib import ExitStack, nullcontext

import pytest
from celery import shared_task
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from celery_idem import IdempotentTask
from celery_idem.backends.generic import GenericBackend
from celery_idem.connection import bookkeeping_connection, release_bookkeeping
from celery_idem.producer import KEY_HEADER as HEADER
from celery_idem.testing import use_backend
from tests.pgtrace import round_trips

pytestmark = pytest.mark.django_db(transaction=True)

#: Statements per path: (publish, fresh run, replay), per backend. The PostgreSQL
#: budget is at most 3 for a fresh run and 2 for a replay; it spends 2 and 1.
EXPECTED = {"native": (1, 2, 1), "generic": (1, 3, 2)}
#: Transaction control, which Django logs too; atomic=True adds BEGIN/COMMIT around the
#: body, which a body writing to the database needs anyway.
CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")


@shared_task(base=IdempotentTask, bind=True, idempotency_key="echo/{n}", name="tests.echo")
def echo(self, n):
    return n


@shared_task(base=IdempotentTask, bind=True, idempotency_key="aecho/{n}", atomic=True,
             name="tests.atomic_echo")
def atomic_echo(self, n):
    return n


def statements(fn):
    """The statements ``fn`` runs, on Django's connection and on the bookkeeping one
    (PostgreSQL), by connection: {"django": [...], "bookkeeping": [...]}."""
    wrappers = {"django": connection}
    if connection.vendor == "postgresql":
        # The one this thread gets: released after each use, taken again from the idle.
        wrappers["bookkeeping"] = bookkeeping_connection(connection.alias)
        release_bookkeeping()
    with ExitStack() as stack:
        captured = {name: stack.enter_context(CaptureQueriesContext(wrapper))
                    for name, wrapper in wrappers.items()}
        fn()
    return {name: [q["sql"] for q in c.captured_queries
                   if not q["sql"].lstrip().upper().startswith(CONTROL)]
            for name, c in captured.items()}


def count(fn):
    return sum(len(sqls) for sqls in statements(fn).values())


@pytest.mark.parametrize("task", [echo, atomic_echo], ids=["default", "atomic"])
def test_statements_per_path(backend, backend_kind, task):
    """Publish, a fresh claim-to-commit, and a replay each cost their pinned count."""
    publish, fresh, replay = EXPECTED[backend_kind]
    key = task.intent((1,)).key
    assert count(lambda: task.apply_async(args=(1,))) == publish
    assert count(lambda: task.apply(args=(1,), headers={HEADER: key}).get()) == fresh
    assert count(lambda: task.apply(args=(1,), headers={HEADER: key}).get()) == replay



def test_the_intent_rides_the_callers_transaction_or_the_bookkeeping_connection(
        backend_kind):
    """Outside a transaction the intent is one statement on the bookkeeping connection
    (PostgreSQL: prepared, its commit durable); inside ``atomic()`` it is written in the
    caller's transaction, on Django's connection (the outbox)."""
    # The library's own choice of backend (the ``backend`` fixture would pin one).
    with use_backend(GenericBackend("default")) if backend_kind == "generic" else nullcontext():
        outside = statements(lambda: echo.apply_async(args=(2,)))
        with transaction.atomic():
            inside = statements(lambda: echo.apply_async(args=(3,)))
    if backend_kind == "native":
        assert (len(outside["django"]), len(outside["bookkeeping"])) == (0, 1)
        assert "set_config('synchronous_commit', 'on', true)" in outside["bookkeeping"][0]
        assert (len(inside["django"]), len(inside["bookkeeping"])) == (1, 0)
    else:
        assert len(outside["django"]) == len(inside["django"]) == 1


def test_atomic_statements_are_prepared_and_the_projects_own_queries_are_not(backend_kind):
    """Django leaves psycopg's prepare_threshold at None (nothing prepared): the library's
    statements on Django's connection are prepared on their second use in the session;
    the project's own queries, on Django's client-binding cursors, never are."""
    if backend_kind != "native" or connection.vendor != "postgresql":
        pytest.skip("prepared statements are the PostgreSQL backend's")
    for n in (10, 11, 12):
        assert atomic_echo.apply(args=(n,)).get() == n
    with connection.cursor() as cursor:
        for _ in range(3):
            cursor.execute("SELECT count(*) FROM celery_idem_job WHERE attempt >= %s", [0])
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("UPDATE celery_idem_job" in text and "attempt + 1" in text
               for text in prepared), prepared  # the claim
    assert any("finished_at" in text for text in prepared), prepared  # the commit
    assert not any("WHERE attempt >=" in text for text in prepared)  # the project's


def test_a_project_that_sets_prepare_threshold_keeps_its_choice(backend_kind, monkeypatch):
    """``OPTIONS["prepare_threshold"]`` set by the project (None behind an old PgBouncer):
    the library's statements run on Django's own cursor, as the project's do."""
    if backend_kind != "native" or connection.vendor != "postgresql":
        pytest.skip("prepared statements are the PostgreSQL backend's")
    import psycopg

    from celery_idem.backends import prepared

    with prepared.cursor(connection) as cursor:
        assert not isinstance(cursor.cursor, psycopg.ClientCursor)  # server-side binding
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "prepare_threshold", None)
    with prepared.cursor(connection) as cursor:
        assert isinstance(cursor.cursor, psycopg.ClientCursor)  # Django's, unprepared


def _native_postgresql(backend_kind):
    if backend_kind != "native" or connection.vendor != "postgresql":
        pytest.skip("pipeline mode is the PostgreSQL backend's")


def test_an_atomic_commit_and_its_COMMIT_share_one_round_trip(backend_kind):
    """A fresh atomic run: BEGIN, the claim, then the commit move pipelined with COMMIT:
    three round trips, not four. (A replay is BEGIN, its one read, COMMIT.) Measured
    once the statements are prepared: psycopg spends one more round trip on a
    statement's first prepared use in a session."""
    _native_postgresql(backend_kind)

    def run(n):
        return lambda: atomic_echo.apply(args=(n,), headers={
            HEADER: atomic_echo.intent((n,)).key}).get()

    for n in (20, 21, 22):
        atomic_echo.apply_async(args=(n,))
    for n in (21, 22):  # fresh runs and replays: every statement prepared
        run(n)()
        run(n)()
    assert round_trips(connection, run(20)) == 3
    assert round_trips(connection, run(20)) == 3


def test_a_pipelined_commit_that_loses_its_fence_commits_nothing(backend_kind):
    """The commit move pipelined with COMMIT matches nothing (another attempt holds the
    key): the statement fails, the server skips the COMMIT, the body's write rolls back,
    and the connection is usable afterwards."""
    _native_postgresql(backend_kind)
    from celery_idem.backends import Change
    from celery_idem.models import Job
    from celery_idem.states import State

    atomic_echo.apply_async(args=(23,))
    job = Job.objects.get(key=atomic_echo.intent((23,)).key)
    backend = get_backend_for_test()
    with pytest.raises(RuntimeError, match="rolled back"), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(worker="the body's write")
        moved = backend.apply(Change(job.pk, "succeeded", State.RUNNING, attempt=7,
                                     values={"result": 1}), now(), final=True)
        assert moved is False
        raise RuntimeError("rolled back")
    job.refresh_from_db()
    assert (job.state, job.worker) == (State.PENDING, "")
    assert Job.objects.filter(pk=job.pk).exists()  # the connection still works


def test_inside_the_callers_transaction_the_commit_waits_for_its_block(backend_kind):
    """An atomic body inside a caller's ``atomic()`` is a savepoint: its last write must
    not commit the caller's transaction, so it runs alone (two round trips: no BEGIN, the
    claim, the commit move; nothing pipelined) and the caller decides."""
    _native_postgresql(backend_kind)
    from celery_idem.models import Job

    key = atomic_echo.intent((24,)).key
    atomic_echo.apply_async(args=(24,))
    with pytest.raises(RuntimeError, match="caller"), transaction.atomic():
        connection.cursor().execute("SELECT 1")  # the caller's transaction has begun
        run = lambda: atomic_echo.apply(args=(24,), headers={HEADER: key}).get()  # noqa: E731
        # SAVEPOINT and RELEASE SAVEPOINT around the claim and the commit move
        assert round_trips(connection, run) == 2 + 2
        raise RuntimeError("the caller rolls back")
    assert Job.objects.get(key=key).state == "PENDING"


def get_backend_for_test():
    from celery_idem.backends import get_backend

    return get_backend("default")


def now():
    from django.utils import timezone

    return timezone.now()
