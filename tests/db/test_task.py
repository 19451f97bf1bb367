"""IdempotentTask end to end in-process (``apply``): publish checks, replay, policies."""

from __future__ import annotations

import datetime

import pytest
from celery import chain, group, shared_task
from celery.exceptions import Ignore

from celery_idem import (
    ArgumentsNotJSON,
    IdempotentTask,
    InProgress,
    InvalidKey,
    KeyMismatch,
    MissingKey,
    StoredFailure,
)
from celery_idem.by_name import on_before_task_publish
from celery_idem.models import Job, Transition
from celery_idem.producer import ERROR_HEADER, refused_error
from celery_idem.producer import KEY_HEADER as HEADER
from django_app.celery import app
from django_app.effects.models import Effect
from django_app.effects.tasks import (
    add,
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
        """FAILED replays as StoredFailure naming the original error; the body runs once."""
        assert run(always_fails, 3).state == "FAILURE"
        again = run(always_fails, 3)
        assert isinstance(again.result, StoredFailure)
        assert again.result.exc_type == "ValueError" and "boom 3" in str(again.result)
        assert Effect.objects.filter(key="fail/3").count() == 1
        assert Job.objects.get(key="fail/3").state == "FAILED"

    def test_stored_failure_survives_celerys_exception_rebuild(self):
        """Celery rebuilds a task's exception as cls(*args) on the caller's side."""
        exc = StoredFailure.from_record({"type": "ValueError", "message": "x"})
        rebuilt = StoredFailure(*exc.args)
        assert str(rebuilt) == "ValueError: x"
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


class TestPublish:
    def test_delay_writes_the_intent_and_sends_the_key_header(self, backend):
        """delay(): PENDING intent under the template key, arguments stored."""
        result = ship_order.delay(77)
        job = Job.objects.get(key="ship/77")
        assert (job.state, job.args, job.task_id) == ("PENDING", [77], result.id)

    def test_per_call_key_overrides_the_template(self, backend):
        """apply_async(idempotency_key=...) wins over the declared template."""
        ship_order.apply_async(args=(42,), idempotency_key="ship/42/manual")
        assert Job.objects.filter(key="ship/42/manual").exists()
        assert not Job.objects.filter(key="ship/42").exists()

    def test_arguments_that_are_not_json_are_refused_before_sending(self, backend):
        """Nothing is written or sent for a datetime argument."""
        with pytest.raises(ArgumentsNotJSON):
            ship_order.delay(datetime.datetime(2026, 1, 1))
        assert not Job.objects.exists()

    @pytest.mark.parametrize("key", ["", "x" * 256, 5])
    def test_bad_per_call_keys_are_refused(self, backend, key):
        """Empty, too long or non-string keys raise InvalidKey at publish."""
        with pytest.raises(InvalidKey):
            notify.apply_async(args=(1, "hi"), idempotency_key=key)
        assert not Job.objects.exists()

    def test_missing_per_call_key_is_refused(self, backend):
        """A PER_CALL task needs its key on every call."""
        assert notify._get_current_object()._key_spec.per_call
        with pytest.raises(MissingKey):
            notify.delay(1, "hi")

    def test_same_key_other_arguments_is_a_key_mismatch_at_publish(self, backend):
        """The second publish raises before sending; the stored intent is unchanged."""
        notify.apply_async(args=(1, "hi"), idempotency_key="n-1")
        with pytest.raises(KeyMismatch):
            notify.apply_async(args=(1, "bye"), idempotency_key="n-1")
        assert Job.objects.get(key="n-1").args == [1, "hi"]

    def test_signatures_chains_and_groups_write_intents(self, backend):
        """Canvas goes through apply_async: every task that can be keyed is."""
        add.s(1, 2).delay()
        group(add.s(i, 100) for i in range(3)).apply_async()
        chain(ship_order.s(5), add.s()).apply_async()
        assert Job.objects.filter(task_name=add.name).count() == 4
        assert Job.objects.filter(key="ship/5").exists()

    def test_send_task_by_name_gets_its_intent_from_the_publish_hook(self, backend):
        """app.send_task skips apply_async; the hook writes the intent and the header."""
        app.send_task(ship_order.name, args=(99,))
        assert Job.objects.get(key="ship/99").state == "PENDING"

    def test_publish_hook_marks_a_bad_send_task_message(self, backend):
        """The hook cannot stop a message, so it marks it; the worker raises the error."""
        headers = {"task": ship_order.name, "id": "t-1"}
        on_before_task_publish(sender=ship_order.name, headers=headers,
                               body=([{"not": {"json"}}], {}, {}))
        assert headers[ERROR_HEADER]["type"] == "ArgumentsNotJSON"
        request = type("Request", (), {"headers": headers})()
        assert isinstance(refused_error(request), ArgumentsNotJSON)
        assert not Job.objects.exists()

    def test_direct_call_is_a_plain_function_call(self, backend):
        """Calling the task object runs the body, with its key, without claiming anything."""
        assert add(2, 3) == 5
        assert not Job.objects.exists()
        assert Effect.objects.get().key == add.intent((2, 3)).key


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
