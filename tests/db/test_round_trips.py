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
from celery_idem.backends import routines
from celery_idem.backends.generic import GenericBackend
from celery_idem.connection import bookkeeping_connection, release_bookkeeping
from celery_idem.producer import KEY_HEADER as HEADER
from celery_idem.testing import use_backend
from tests.pgtrace import round_trips

pytestmark = pytest.mark.django_db(transaction=True)

#: Statements per path: (publish, fresh run, replay), per backend. The PostgreSQL
#: budget is at most 3 for a fresh run and 2 for a replay; it spends 2 and 1. MySQL's
#: own backend has no UPDATE ... RETURNING: the portable backend's statements.
EXPECTED = {"PostgreSQLBackend": (1, 2, 1), "MySQLBackend": (1, 3, 2),
            "GenericBackend": (1, 3, 2)}
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
    (PostgreSQL), by connection: {"django": [...], "bookkeeping": [...]}; after the
    process's one read of which stored routines the database has (backends/routines.py)."""
    wrappers = {"django": connection}
    if connection.vendor == "postgresql":
        routines.calls(connection)
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
    publish, fresh, replay = EXPECTED[type(backend).__name__]
    key = task.intent((1,)).key
    assert count(lambda: task.apply_async(args=(1,))) == publish
    assert count(lambda: task.apply(args=(1,), headers={HEADER: key}).get()) == fresh
    assert count(lambda: task.apply(args=(1,), headers={HEADER: key}).get()) == replay



def test_the_intent_rides_the_callers_transaction_or_the_bookkeeping_connection(
        backend_kind):
    """Outside a transaction the intent is one statement on the bookkeeping connection
    (PostgreSQL; its commit flushed: tests/db/test_dedicated_connection.py); inside
    ``atomic()`` it is written in the caller's transaction, on Django's connection (the
    outbox)."""
    # The library's own choice of backend (the ``backend`` fixture would pin one).
    with use_backend(GenericBackend("default")) if backend_kind == "generic" else nullcontext():
        outside = statements(lambda: echo.apply_async(args=(2,)))
        with transaction.atomic():
            inside = statements(lambda: echo.apply_async(args=(3,)))
    if backend_kind == "native" and connection.vendor == "postgresql":
        assert (len(outside["django"]), len(outside["bookkeeping"])) == (0, 1)
        assert (len(inside["django"]), len(inside["bookkeeping"])) == (1, 0)
    else:
        assert len(outside["django"]) == len(inside["django"]) == 1


def _prepared_statements():
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [routines.statement_of(row[0]) for row in cursor.fetchall()]


@pytest.fixture
def new_session():
    """Django's connection reopened for the test (its settings read at connect), and
    closed after it (before the test's settings are restored)."""
    connection.close()
    yield
    connection.close()


def test_asked_for_the_librarys_statements_are_prepared_and_the_projects_are_not(
        backend_kind, settings, new_session):
    """CELERY_IDEM_PREPARED_STATEMENTS: the library's statements on Django's connection
    are prepared on their second use in the session; the project's own queries, on
    Django's client-binding cursors, never are. (Not asked for, nothing is prepared:
    tests/db/test_session_state.py.)"""
    if backend_kind != "native" or connection.vendor != "postgresql":
        pytest.skip("prepared statements are the PostgreSQL backend's")
    settings.CELERY_IDEM_PREPARED_STATEMENTS = True
    for n in (10, 11, 12):
        assert atomic_echo.apply(args=(n,)).get() == n
    with connection.cursor() as cursor:
        for _ in range(3):
            cursor.execute("SELECT count(*) FROM celery_idem_job WHERE attempt >= %s", [0])
    prepared = _prepared_statements()
    assert any("UPDATE celery_idem_job" in text and "attempt + 1" in text
               for text in prepared), prepared  # the claim
    assert any("finished_at" in text for text in prepared), prepared  # the commit
    assert not any("WHERE attempt >=" in text for text in prepared)  # the project's


@pytest.mark.parametrize(("options", "setting", "prepares"), [
    ({"server_side_binding": True, "prepare_threshold": 0}, False, True),
    ({"prepare_threshold": None}, True, False),
    ({"prepare_threshold": 0}, False, False),
], ids=["project-prepares", "project-forbids", "threshold-without-server-binding"])
def test_the_projects_options_decide_where_they_say(backend_kind, settings, monkeypatch,
                                                   options, setting, prepares):
    """A project whose own queries are prepared (``server_side_binding`` and a
    ``prepare_threshold``) gets the library's prepared too, without the setting; one that
    sets ``prepare_threshold`` to None (the setting on: check W007) gets nothing prepared;
    a threshold without server-side binding prepares nothing of the project's, so
    nothing of the library's either."""
    if backend_kind != "native" or connection.vendor != "postgresql":
        pytest.skip("prepared statements are the PostgreSQL backend's")
    settings.CELERY_IDEM_PREPARED_STATEMENTS = setting
    connection.close()
    monkeypatch.setitem(connection.settings_dict, "OPTIONS",
                        {**connection.settings_dict["OPTIONS"], **options})
    try:
        for n in (13, 14, 15):
            assert atomic_echo.apply(args=(n,)).get() == n
        claim_prepared = any("attempt + 1" in text for text in _prepared_statements())
    finally:
        connection.close()
    assert claim_prepared is prepares


def _native_postgresql(backend_kind):
    if backend_kind != "native" or connection.vendor != "postgresql":
        pytest.skip("pipeline mode is the PostgreSQL backend's")


@pytest.mark.parametrize("prepared", [False, True], ids=["unprepared", "prepared"])
def test_an_atomic_run_sends_its_COMMIT_with_the_commit(
        backend_kind, settings, new_session, prepared):
    """A fresh atomic run: BEGIN, the claim, then the commit move pipelined with COMMIT:
    three round trips, not four; a replay likewise (BEGIN, its one read, COMMIT). Without
    prepared statements (the default) from the session's first run; with them, once they
    are prepared: psycopg spends one more round trip on a statement's first prepared use
    in a session."""
    _native_postgresql(backend_kind)
    settings.CELERY_IDEM_PREPARED_STATEMENTS = prepared

    def run(n):
        return lambda: atomic_echo.apply(args=(n,), headers={
            HEADER: atomic_echo.intent((n,)).key}).get()

    for n in (20, 21, 22):
        atomic_echo.apply_async(args=(n,))
    if prepared:
        for n in (21, 22):  # fresh runs and replays: every statement prepared
            run(n)()
            run(n)()
    assert round_trips(connection, run(20)) == 3
    assert round_trips(connection, run(20)) == 3
    assert bool(_prepared_statements()) is prepared


@pytest.mark.parametrize("synchronous", [False, True], ids=["unflushed", "flushed"])
def test_bookkeeping_writes_are_one_round_trip_each(backend_kind, settings, synchronous):
    """On the bookkeeping connection: the intent, the claim and the commit one round trip
    each. The claim's and commit's transaction-scoped ``synchronous_commit = off`` is
    pipelined with them (backends/pipeline.py): it costs no round trip."""
    _native_postgresql(backend_kind)
    from celery_idem import claims

    settings.CELERY_IDEM_SYNCHRONOUS_COMMIT = synchronous
    wrapper = bookkeeping_connection(connection.alias)  # the one the calls below take
    release_bookkeeping()
    intent = echo.intent((30,))
    won: list = []

    def claim():
        won.append(claims.acquire(intent, worker="h/1", task_id="t-30", lease_seconds=60,
                                  using="default", dedicated=True)[1])
        release_bookkeeping()

    assert round_trips(wrapper, lambda: echo.apply_async(args=(30,))) == 1
    assert round_trips(wrapper, claim) == 1
    assert round_trips(wrapper, lambda: won[0].succeed(30)) == 1


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
