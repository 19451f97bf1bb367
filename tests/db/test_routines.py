"""The hot path's statements as stored routines (celery_idem/backends/routines.py,
the initial migration): called where installed, the statements themselves elsewhere, with the
same outcomes either way."""

from __future__ import annotations

import importlib

import pytest
from celery import shared_task
from django.apps import apps
from django.db import connection, transaction
from django.utils import timezone

from celery_idem import IdempotentTask, claims
from celery_idem.backends import Change, get_backend, routines
from celery_idem.models import Job
from celery_idem.producer import KEY_HEADER
from celery_idem.states import State
from tests.db.test_round_trips import atomic_echo, echo, statements

pytestmark = pytest.mark.django_db(transaction=True)

migration = importlib.import_module("celery_idem.migrations.0001_initial")


@pytest.fixture(autouse=True)
def _postgresql(backend_kind):
    if backend_kind != "native" or connection.vendor != "postgresql":
        pytest.skip("stored routines are the PostgreSQL backend's")
    routines.forget()
    yield
    routines.forget()


@pytest.fixture(params=["routines", "statements"])
def way(request, monkeypatch):
    """Each test runs with the routines called and with the statements sent themselves
    (a database without them)."""
    if request.param == "statements":
        monkeypatch.setattr(routines, "calls", lambda connection: {})
    return request.param


@shared_task(base=IdempotentTask, bind=True, idempotency_key="rfail/{n}", name="tests.rfail")
def fails(self, n):
    raise ValueError(n)


def sent(fn):
    return [sql for sqls in statements(fn).values() for sql in sqls]


def called(sqls):
    return [any(r.name in sql for r in routines.hot()) for sql in sqls]


def test_the_migrations_installed_every_routine(way):
    installed = set(routines.calls(connection).values())
    expected = {r.call for r in routines.hot()} if way == "routines" else set()
    assert installed == expected


@pytest.mark.parametrize("task", [echo, atomic_echo], ids=["default", "atomic"])
def test_a_publish_a_fresh_run_and_a_replay(way, task):
    """Every statement of the three paths is a call where the routines are installed
    and none is elsewhere; the job ends the same."""
    key = task.intent((1,)).key
    paths = [sent(lambda: task.apply_async(args=(1,))),
             sent(lambda: task.apply(args=(1,), headers={KEY_HEADER: key}).get()),
             sent(lambda: task.apply(args=(1,), headers={KEY_HEADER: key}).get())]
    assert [len(p) for p in paths] == [1, 2, 1]
    assert {c for p in paths for c in called(p)} == {way == "routines"}
    job = Job.objects.get(key=key)
    assert (job.state, job.attempt, job.result) == ("SUCCEEDED", 1, 1)


def test_a_failure_is_stored_with_its_history_line(way):
    key = fails.intent((2,)).key
    fails.apply_async(args=(2,))
    assert called(sent(lambda: fails.apply(args=(2,), headers={KEY_HEADER: key}))) == [
        way == "routines"] * 2
    job = Job.objects.get(key=key)
    assert (job.state, job.error["type"]) == ("FAILED", "ValueError")
    assert list(job.transitions.values_list("event", "attempt_started_at")) == [
        ("failed", job.started_at)]


def test_a_fenced_out_commit_writes_nothing_and_a_claim_loses_to_a_running_one(way):
    intent = echo.intent((3,))
    outcome, claim = claims.acquire(intent, worker="w/1", task_id="t-1", lease_seconds=60,
                                    using="default", dedicated=True)
    assert outcome.won and claim is not None
    lost, none = claims.acquire(intent, worker="w/2", task_id="t-2", lease_seconds=60,
                                using="default", dedicated=True)
    assert (lost.won, lost.row.attempt, none) == (False, 1, None)
    Job.objects.filter(pk=claim.job_id).update(attempt=2)  # a newer attempt took over
    assert claim.succeed(3) is False
    job = Job.objects.get(pk=claim.job_id)
    assert (job.state, job.result) == ("RUNNING", None)


def test_an_atomic_commit_that_loses_its_fence_rolls_the_body_back(way):
    """The final commit's failure (division by zero, move_result_final) comes out of the
    routine as it does out of the statement: the COMMIT queued behind it is skipped."""
    atomic_echo.apply_async(args=(4,))
    job = Job.objects.get(key=atomic_echo.intent((4,)).key)
    backend = get_backend("default")
    with pytest.raises(RuntimeError, match="rolled back"), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(worker="the body's write")
        moved = backend.apply(Change(job.pk, "succeeded", State.RUNNING, attempt=7,
                                     values={"result": 1, "finished_at": timezone.now(),
                                             "lease_expires_at": None}),
                              timezone.now(), final=True)
        assert moved is False
        raise RuntimeError("rolled back")
    job.refresh_from_db()
    assert (job.state, job.worker) == (State.PENDING, "")


def test_without_the_migration_the_statements_run_themselves():
    """The routines uninstalled: no routine is left, the backend sends the statements,
    and a task runs as before; applied again, the routines are called."""
    with connection.schema_editor() as editor:
        migration.uninstall(apps, editor)
    try:
        assert routines.calls(connection) == {}
        key = echo.intent((5,)).key
        echo.apply_async(args=(5,))
        assert called(sent(lambda: echo.apply(args=(5,), headers={KEY_HEADER: key}).get())
                      ) == [False, False]
    finally:
        with connection.schema_editor() as editor:
            migration.install(apps, editor)
    assert len(routines.calls(connection)) == len(routines.hot())
