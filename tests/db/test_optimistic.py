"""``atomic="optimistic"`` on every database: a first delivery whose key has no row runs
its body with no claim and commits with one insert of the finished row; anything else
rolls the body back and runs the message as ``atomic=True`` does. Eager calls carrying
broker durability's headers take the worker's path (``runner.Run.optimistic``); the
crash and concurrency cases run on real workers (tests/integration/test_optimistic.py).
"""

from __future__ import annotations

import pytest
from celery import shared_task
from django.core import checks as django_checks
from django.db import connection

from celery_idem import IdempotentTask
from celery_idem.backends import routines
from celery_idem.errors import ConfigurationError, KeyMismatch
from celery_idem.models import Job, Transition
from django_app.effects.models import Effect
from tests.db.test_durability import unwritten
from tests.db.test_round_trips import statements
from tests.pgtrace import round_trips

pytestmark = pytest.mark.django_db(transaction=True)

#: How many times each key's body started, rolled back or not.
runs: dict[str, int] = {}


@shared_task(base=IdempotentTask, bind=True, atomic="optimistic",
             idempotency_key="opt/{n}", name="tests.optimistic")
def optimistic(self, n, fail=False, note=""):
    key = f"opt/{n}"
    runs[key] = runs.get(key, 0) + 1
    Effect.objects.create(key=key)
    if fail:
        raise ValueError(f"no {n}")
    return {"n": n}


def run(n: int, **kwargs):
    """One delivery of ``optimistic(n)`` as a worker gets it with broker durability."""
    return optimistic.apply(args=(n,), kwargs=kwargs, headers=unwritten(f"opt/{n}"))


@pytest.fixture(autouse=True)
def fresh_runs():
    runs.clear()


def test_a_fresh_key_runs_once_and_commits_with_one_insert_of_the_finished_row(backend):
    """No claim before the body: the body's own write and the finished row's insert are
    the only statements; the row is SUCCEEDED at attempt 1 with the result, no history."""
    by_connection = statements(lambda: run(1).get())
    sqls = [routines.statement_of(s) for group in by_connection.values() for s in group]
    assert len(sqls) == 2, sqls
    assert "effects_effect" in sqls[0] and "finished_at" in sqls[1]
    job = Job.objects.get(key="opt/1")
    assert (job.state, job.attempt, job.result, job.lease_expires_at) == (
        "SUCCEEDED", 1, {"n": 1}, None)
    assert job.started_at <= job.finished_at and job.worker
    assert Effect.objects.filter(key="opt/1").count() == 1 and runs["opt/1"] == 1
    assert not Transition.objects.exists()


def test_round_trips_of_a_fresh_key_and_of_a_duplicate(backend_kind):
    """BEGIN, the body's write, the finished row's insert, COMMIT: four round trips (the
    insert is not pipelined with the COMMIT: measured, it did not pay). A duplicate: BEGIN,
    the body's write, the insert that finds the row, ROLLBACK; then the atomic path's
    BEGIN, claim (lost: the finished row, replayed) and COMMIT."""
    if backend_kind != "native" or connection.vendor != "postgresql":
        pytest.skip("round trips are counted in PostgreSQL's protocol trace")
    assert round_trips(connection, lambda: run(6).get()) == 4
    assert round_trips(connection, lambda: run(6).get()) == 4 + 3
    assert Job.objects.get(key="opt/6").state == "SUCCEEDED" and runs["opt/6"] == 2


def test_a_duplicate_of_a_finished_key_rolls_its_body_back_and_replays(backend):
    """The duplicate has no claim to wait on: its body runs, its insert finds the row,
    its writes roll back, and the atomic path replays the first result."""
    first = run(2).get()
    assert run(2).get() == first
    assert runs["opt/2"] == 2
    assert Effect.objects.filter(key="opt/2").count() == 1
    assert Job.objects.get(key="opt/2").attempt == 1


def test_other_arguments_under_a_finished_key_roll_back_and_raise_key_mismatch(backend):
    """Its body runs before anything is read (and rolls back): the claim path then finds
    the other arguments."""
    run(3).get()
    with pytest.raises(KeyMismatch):
        run(3, note="other").get()
    assert runs["opt/3"] == 2
    assert Effect.objects.filter(key="opt/3").count() == 1


def test_a_key_with_a_pending_row_runs_under_a_claim(backend, settings):
    """An intent (database durability), a retry or a reset leave a PENDING row: the
    message is not a first delivery without a row, so it runs as atomic=True does, its
    body once, under attempt 1."""
    settings.CELERY_IDEM_DURABILITY = "database"
    result = optimistic.apply_async(args=(4,))
    assert Job.objects.get(key="opt/4").state == "PENDING"
    optimistic.apply(args=(4,), task_id=result.id,
                     headers={"celery_idem_key": "opt/4"}).get()
    job = Job.objects.get(key="opt/4")
    assert (job.state, job.attempt, job.result) == ("SUCCEEDED", 1, {"n": 4})
    assert runs["opt/4"] == 1


def test_a_body_that_raises_runs_again_under_a_claim_which_records_the_failure(backend):
    """The first run's writes roll back; the second, under the claim, fails the same way
    and the key is FAILED with the body's error, its writes rolled back too."""
    with pytest.raises(ValueError, match="no 5"):
        run(5, fail=True).get()
    job = Job.objects.get(key="opt/5")
    assert (job.state, job.attempt, job.error["type"]) == ("FAILED", 1, "ValueError")
    assert runs["opt/5"] == 2
    assert not Effect.objects.filter(key="opt/5").exists()


def test_a_body_that_needs_a_claim_is_refused_at_registration():
    """self.step, self.heartbeat, self.replace and self.attempt need the claim that an
    optimistic body runs without: the declaration is refused, naming what it uses."""

    @shared_task(base=IdempotentTask, bind=True, atomic="optimistic",
                 idempotency_key="opt-steps/{n}", name="tests.optimistic_steps")
    def with_steps(self, n):
        def later():
            return self.heartbeat()
        return self.step("one", lambda: n), later

    with pytest.raises(ConfigurationError, match=r"self\.heartbeat, self\.step: declare "
                                                 r"atomic=True"):
        with_steps.key_spec()

    @shared_task(base=IdempotentTask, atomic="optimistic", idempotency_key="opt-s/{text}",
                 name="tests.optimistic_unbound")
    def unbound(text):
        return text.replace("a", "b")  # not the task's replace: the body is not bound

    assert unbound.key_spec() is not None


def _step_of(task):
    return task.step("one", lambda: 1)


@shared_task(base=IdempotentTask, bind=True, atomic="optimistic",
             idempotency_key="opt-helper/{n}", name="tests.optimistic_helper")
def through_a_helper(self, n):
    Effect.objects.create(key=f"opt-helper/{n}")
    return _step_of(self)  # out of the registration check's sight


def test_a_step_reached_through_a_helper_raises_and_writes_nothing(backend):
    """At run time the step has no claim to fence it: ConfigurationError naming the mode,
    the body's write rolled back, no job row."""
    with pytest.raises(ConfigurationError, match=r"step\(\) needs a claim, and "
                                                 r"atomic='optimistic'"):
        through_a_helper.apply(args=(1,), headers=unwritten("opt-helper/1")).get()
    assert not Job.objects.filter(key="opt-helper/1").exists()
    assert not Effect.objects.filter(key="opt-helper/1").exists()


def test_an_unknown_atomic_mode_is_refused():
    @shared_task(base=IdempotentTask, atomic="sometimes", idempotency_key="opt-x/{n}",
                 name="tests.optimistic_typo")
    def typo(n):
        return n

    with pytest.raises(ConfigurationError, match="atomic must be True, False or "
                                                 "'optimistic', not 'sometimes'"):
        typo.key_spec()


def test_the_system_check_says_what_optimistic_tasks_give_up(settings):
    from celery_idem.checks import check_optimistic_tasks

    def w009():
        return check_optimistic_tasks()

    settings.CELERY_IDEM_DURABILITY = "broker"
    (found,) = w009()
    assert found.level == django_checks.WARNING and "tests.optimistic" in found.msg
    assert "duplicates run too and roll back" in found.msg
    settings.CELERY_IDEM_DURABILITY = "database"
    (found,) = w009()
    assert "run as atomic=True" in found.msg
