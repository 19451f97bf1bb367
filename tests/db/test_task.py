"""IdempotentTask end to end in-process (``apply``): replay, policies, retries, atomic
bodies, the body's own view, the lease and a database down at the claim. Publishing
(``delay``, ``apply_async``, canvas, ``send_task``) is tests/db/test_task_publish.py."""

from __future__ import annotations

import datetime

import pytest
from celery import Task, shared_task
from celery.exceptions import Ignore

from celery_idem import IdempotentTask, InProgress, KeyMismatch, StoredFailure
from celery_idem.models import Job, Transition
from celery_idem.producer import KEY_HEADER as HEADER
from django_app.effects.models import Effect
from django_app.effects.tasks import (
    always_fails,
    atomic_fails,
    autoretried,
    deduct_stock,
    flaky,
    notify,
    parent_sends_child,
    ship_order,
)

pytestmark = pytest.mark.django_db(transaction=True)


def run(task, *args, key=None, **kwargs):
    """Execute a message of ``task`` in this process, as a worker would."""
    key = key or task.intent(args, kwargs).key
    return task.apply(args=args, kwargs=kwargs, headers={HEADER: key})


@shared_task(base=IdempotentTask, bind=True, idempotency_key="raise/{n}",
             on_in_progress="raise", name="tests.raise_policy")
def raise_policy(self, n):
    return n


@shared_task(base=IdempotentTask, bind=True, idempotency_key="ignore/{n}",
             on_in_progress="ignore", name="tests.ignore_policy")
def ignore_policy(self, n):
    return n


@shared_task(base=IdempotentTask, bind=True, idempotency_key="parentfail/{n}", atomic=True,
             name="tests.parent_fails_after_send")
def parent_fails_after_send(self, n):
    notify.delay(n, "never sent")
    raise RuntimeError("parent failed")


@shared_task(base=IdempotentTask, bind=True, idempotency_key="obj/{n}", name="tests.returns_obj")
def returns_object(self, n):
    return object()


@shared_task(base=IdempotentTask, bind=True, idempotency_key="beat/{n}", name="tests.beats")
def heartbeats(self, n):
    return self.heartbeat(120).isoformat()


class TestReplay:
    def test_duplicate_of_a_succeeded_key_does_not_run_the_body(self, backend):
        """The second message returns the stored result; one effect."""
        first = run(ship_order, 42)
        second = run(ship_order, 42)
        assert first.get() == second.get() == {"shipped": 42, "attempt": 1}
        assert Effect.objects.filter(key="ship/42").count() == 1

    def test_duplicate_of_a_failed_key_reraises_the_stored_failure(self, backend):
        """FAILED replays the body's own error, also a StoredFailure; the body runs once."""
        first = run(always_fails, 3)
        again = run(always_fails, 3)
        assert first.state == again.state == "FAILURE"
        assert isinstance(again.result, StoredFailure) and isinstance(again.result, ValueError)
        assert again.result.args == first.result.args and again.result.exc_type == "ValueError"
        assert Effect.objects.filter(key="fail/3").count() == 1
        assert Job.objects.get(key="fail/3").state == "FAILED"

    def test_stored_failure_survives_celerys_exception_rebuild(self):
        """Celery rebuilds a task's exception as cls(*args) on the caller's side."""
        exc = StoredFailure.from_record({"type": "Gone", "module": "not.loaded", "message": "x"})
        rebuilt = StoredFailure(*exc.args)
        assert str(rebuilt) == "Gone: x"
        mismatch = KeyMismatch.build("ns", "k", "a" * 64, "b" * 64)
        assert str(KeyMismatch(*mismatch.args)) == str(mismatch)

    def test_result_that_is_not_json_fails_the_key(self, backend):
        """A result that cannot be stored and replayed fails the job with ResultNotJSON."""
        outcome = run(returns_object, 1)
        assert outcome.state == "FAILURE"
        job = Job.objects.get(key="obj/1")
        assert (job.state, job.error["type"]) == ("FAILED", "ResultNotJSON")


class TestInProgressPolicies:
    def _hold_claim(self, task, n):
        from celery_idem import claims

        intent = task.intent((n,))
        return claims.acquire(intent, worker="other", task_id="other-task",
                              lease_seconds=300, using="default")

    def test_raise_policy_raises_in_progress(self, backend):
        """on_in_progress="raise": a duplicate meeting a live claim fails with InProgress."""
        self._hold_claim(raise_policy, 1)
        outcome = run(raise_policy, 1)
        assert isinstance(outcome.result, InProgress)

    def test_ignore_policy_drops_the_duplicate(self, backend):
        """on_in_progress="ignore": the duplicate is ignored (Celery state IGNORED)."""
        self._hold_claim(ignore_policy, 1)
        outcome = run(ignore_policy, 1)
        assert outcome.state == "IGNORED" or isinstance(outcome.result, Ignore)

    def test_retry_policy_in_eager_mode_raises_in_progress(self, backend):
        """Eager mode cannot wait for another attempt, so it says so."""
        self._hold_claim(ship_order, 5)
        outcome = run(ship_order, 5)
        assert isinstance(outcome.result, InProgress)
        assert Effect.objects.filter(key="ship/5").count() == 0


class TestRetries:
    def test_self_retry_returns_to_pending_and_claims_the_next_attempt(self, backend):
        """self.retry: PENDING between attempts; the retry runs as attempt 2."""
        outcome = run(flaky, 1, failures=1)
        assert outcome.get() == {"n": 1, "attempt": 2, "retries": 1}
        assert Effect.objects.filter(key="flaky/1").count() == 2
        events = list(Transition.objects.filter(job__key="flaky/1").values_list("event", flat=True))
        assert events == ["retry_scheduled"]
        job = Job.objects.get(key="flaky/1")
        assert (job.state, job.attempt) == ("SUCCEEDED", 2)

    def test_autoretry_for_goes_through_the_same_path(self, backend):
        """autoretry_for retries claim again with the next attempt."""
        assert run(autoretried, 1, failures=2).get() == 3
        assert Job.objects.get(key="auto/1").attempt == 3

    def test_retries_exhausted_fail_the_key(self, backend):
        """Past max_retries the failure is stored, and no retry is scheduled."""
        outcome = run(flaky, 2, failures=10)
        assert outcome.state == "FAILURE"
        job = Job.objects.get(key="flaky/2")
        assert (job.state, job.attempt) == ("FAILED", 4)


class TestAtomic:
    def test_atomic_body_failure_rolls_back_its_writes_and_records_the_failure(self, backend):
        """atomic=True: the failed body's effect is gone; the job is FAILED at attempt 1."""
        outcome = run(atomic_fails, 1)
        assert outcome.state == "FAILURE"
        assert Effect.objects.filter(key="atomic-fail/1").count() == 0
        job = Job.objects.get(key="atomic-fail/1")
        assert (job.state, job.attempt, job.error["message"]) == ("FAILED", 1, "rolled back")

    def test_atomic_body_commits_effect_and_result_together(self, backend):
        """The effect row and SUCCEEDED are both there after one run."""
        assert run(deduct_stock, 1, 2, 3).get() == {"deducted": 3, "attempt": 1}
        assert Effect.objects.filter(key="deduct/1/2").count() == 1
        assert Job.objects.get(key="deduct/1/2").state == "SUCCEEDED"

    def test_child_of_an_atomic_body_gets_a_derived_key_after_commit(self, backend):
        """A PER_CALL child sent without a key gets one derived from the parent."""
        run(parent_sends_child, 8)
        child = Job.objects.get(task_name=notify.name)
        assert child.key.startswith("child-") and child.args == [8, "child of 8"]
        again = notify.intent((8, "child of 8"), key=child.key)
        assert again.fingerprint == child.fingerprint

    def test_child_of_a_rolled_back_atomic_body_is_never_sent(self, backend):
        """The child's intent rolls back with the parent and its message is not sent."""
        run(parent_fails_after_send, 1)
        assert not Job.objects.filter(task_name=notify.name).exists()


class TestInsideTheBody:
    def test_body_sees_its_key_and_attempt(self, backend):
        """self.idempotency_key and self.attempt are the claim's."""
        assert run(ship_order, 3).get() == {"shipped": 3, "attempt": 1}
        assert Effect.objects.get(key="ship/3").attempt == 1

    def test_heartbeat_extends_the_lease_from_inside_the_body(self, backend):
        """self.heartbeat() moves the lease and returns its new end."""
        stamp = run(heartbeats, 1).get()
        assert Job.objects.get(key="beat/1").state == "SUCCEEDED"
        assert datetime.datetime.fromisoformat(stamp) > Job.objects.get(key="beat/1").started_at

    def test_external_key_is_stable_across_attempts(self):
        """The key for an external API depends on the idempotency key and scope only."""
        class Fake:
            namespace = "ns"
            idempotency_key = "order/1"
        k1 = IdempotentTask.external_key(Fake(), "charge")
        assert k1 == IdempotentTask.external_key(Fake(), "charge")
        assert k1 != IdempotentTask.external_key(Fake(), "refund")


class TestLeaseAndPersistence:
    @pytest.mark.parametrize("pool,enforced", [("prefork", True), ("solo", False),
                                               ("threads", False), ("gevent", False)])
    def test_lease_follows_the_hard_time_limit_only_where_the_pool_enforces_it(
            self, settings, monkeypatch, pool, enforced):
        """prefork: time_limit + grace, the message's timelimit header winning; pools that
        ignore time limits (and eager mode) get the default lease."""
        from types import SimpleNamespace

        from celery_idem import pools

        settings.CELERY_IDEM_LEASE_GRACE = 7
        settings.CELERY_IDEM_DEFAULT_LEASE = 99
        monkeypatch.setattr(pools, "_pool_enforces_time_limits", False)
        task = ship_order._get_current_object()
        task.push_request(timelimit=(30, None))
        try:
            assert task.lease_seconds() == 99  # not in a worker: nothing enforces it
            pools.note_pool(sender=SimpleNamespace(pool_cls=pool))
            assert task.lease_seconds() == (37 if enforced else 99)
        finally:
            task.pop_request()

    def test_database_down_at_claim_means_the_body_does_not_run(self, backend, monkeypatch):
        """Fail closed: a claim that cannot be written raises PersistenceError, no effect."""
        from django.db import OperationalError

        from celery_idem import PersistenceError

        def down(*args, **kwargs):
            raise OperationalError("connection refused")

        monkeypatch.setattr(backend, "claim", down)
        outcome = run(ship_order, 6)
        assert isinstance(outcome.result, PersistenceError)
        assert isinstance(outcome.result.__cause__, OperationalError)
        assert not Effect.objects.filter(key="ship/6").exists()


@shared_task(base=IdempotentTask, bind=True, idempotency_key="view/{n}",
             name="tests.request_view")
def request_view(self, n):
    return [len(self.request_stack.stack), self.request.id, self.attempt]


class _Later(Task):
    """A base whose own __call__ comes after IdempotentTask's in the class order."""

    calls: list[str] = []

    def __call__(self, *args, **kwargs):
        _Later.calls.append(self.request.id)
        return super().__call__(*args, **kwargs)


class _Mixed(IdempotentTask, _Later):
    pass


@shared_task(base=_Mixed, bind=True, idempotency_key="mixed/{n}", name="tests.mixed_call")
def mixed_call(self, n):
    return [len(self.request_stack.stack), self.attempt]


def test_the_body_runs_under_the_messages_own_request():
    """As a plain Celery task's: no second request is pushed for the body (Celery's
    Task.__call__ would push a copy), so it sees the message's own, with its claim."""
    result = run(request_view, 1)
    assert result.get() == [1, result.id, 1]


def test_a_base_defining_call_after_idempotent_task_still_runs():
    """A __call__ that comes after IdempotentTask's in the class order is called (and
    Celery's Task.__call__ behind it pushes its request for the body)."""
    _Later.calls.clear()
    result = run(mixed_call, 2)
    assert result.get() == [2, 1]
    assert _Later.calls == [result.id]
