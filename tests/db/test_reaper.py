"""The recovery pass against the database, with the clock moved by freezegun."""

from __future__ import annotations

import dataclasses
import threading
from datetime import timedelta

import pytest
from celery import shared_task
from django.db import connection, connections
from django.test import override_settings
from django.utils import timezone
from freezegun import freeze_time

from celery_idem import IdempotentTask, claims
from celery_idem.backends import Change
from celery_idem.errors import InvalidTransition
from celery_idem.models import Job, Transition
from celery_idem.producer import KEY_HEADER as HEADER
from celery_idem.producer import write_intent
from celery_idem.recovery import due
from celery_idem.recovery import resend as dispatch
from celery_idem.recovery import sweep as reaper
from celery_idem.states import State
from django_app.effects.tasks import ship_order

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60
TIMEOUT = 600  # CELERY_IDEM_DISPATCH_TIMEOUT in these tests
T0 = "2030-01-01 12:00:00"


@shared_task(base=IdempotentTask, bind=True, idempotency_key="twice/{n}", max_attempts=2,
             name="tests.reaper.twice")
def at_most_twice(self, n):
    return n


@shared_task(base=IdempotentTask, bind=True, idempotency_key="mail/{n}",
             on_stale_claim="uncertain", name="tests.reaper.send_mail")
def send_mail(self, n):
    return n


@pytest.fixture(autouse=True)
def timeouts():
    with override_settings(CELERY_IDEM_DISPATCH_TIMEOUT=TIMEOUT,
                           CELERY_IDEM_DISPATCH_MAX_BACKOFF=4 * TIMEOUT):
        yield


@pytest.fixture
def sent(monkeypatch):
    """Every message the reaper sends, as (job key, task id), instead of the broker."""
    messages: list[tuple[str, str]] = []
    lock = threading.Lock()

    def fake(job, countdown=None, task_id=None):
        with lock:
            messages.append((job.key, task_id))
        return task_id

    monkeypatch.setattr(reaper, "redispatch", fake)
    return messages


def publish(task=ship_order, n=1, options=None):
    intent = dataclasses.replace(task.intent((n,), {}), options=options or {})
    write_intent(intent, f"pub-{intent.key}")
    return intent


def claim(intent, task_id="t-1", worker="host/1", lease=LEASE):
    _, won = claims.acquire(intent, worker=worker, task_id=task_id, lease_seconds=lease,
                            using="default")
    assert won is not None
    return won


def events(key):
    return list(Transition.objects.filter(job__key=key).order_by("id")
                .values_list("event", flat=True))


def last(key, event):
    return Transition.objects.filter(job__key=key, event=event).order_by("-id").first()


def lose_twice():
    """A max_attempts=2 job whose two claims both lost their worker: the second pass
    dead-letters it. Its intent, and that pass's report."""
    with freeze_time(T0):
        intent = publish(at_most_twice)
        claim(intent)
    reap_at("2030-01-01 12:01:01")
    with freeze_time("2030-01-01 12:02:00"):
        claim(intent, task_id="t-2")
    return intent, reap_at("2030-01-01 12:03:01")


def reap_at(when, **kwargs):
    with freeze_time(when):
        return reaper.reap(**kwargs)


class TestStaleClaims:
    def test_a_live_lease_is_left_alone(self, backend, sent):
        """Before the lease expires, the pass releases nothing."""
        with freeze_time(T0):
            claim(publish())
        report = reap_at("2030-01-01 12:00:59")
        assert report.as_dict() == {} and sent == []
        assert Job.objects.get(key="ship/1").state == State.RUNNING

    def test_an_expired_lease_is_released_and_the_job_sent_again(self, backend, sent):
        """Past the lease: RUNNING -> PENDING with the reason, and one message for the key."""
        with freeze_time(T0):
            claim(publish())
        report = reap_at("2030-01-01 12:01:01")
        job = Job.objects.get(key="ship/1")
        assert report.as_dict() == {"released": {ship_order.name: 1}}
        assert (job.state, job.attempt, job.worker, job.dispatch_count) == ("PENDING", 1, "", 1)
        assert job.lease_expires_at is None
        assert sent == [("ship/1", job.task_id)] and job.task_id != "t-1"
        released = last("ship/1", "released")
        assert released.reason.startswith("stale claim: attempt 1 by host/1, lease expired")
        assert (released.from_state, released.to_state, released.worker) == \
            ("RUNNING", "PENDING", "host/1")

    def test_released_job_is_claimed_by_the_next_attempt(self, backend, sent):
        """The re-dispatched message claims attempt 2 and its commit wins."""
        with freeze_time(T0):
            intent = publish()
            first = claim(intent)
        reap_at("2030-01-01 12:01:01")
        second = claim(intent, task_id=sent[0][1], worker="host/2")
        assert second.attempt == 2 and second.succeed({"ok": True})
        assert not first.succeed({"late": True})
        assert events("ship/1") == ["released", "late_finish"]
        job = Job.objects.get(key="ship/1")
        assert (job.state, job.attempt, job.result) == ("SUCCEEDED", 2, {"ok": True})

    def test_dead_lettered_once_attempts_reach_max_attempts(self, backend, sent):
        """Attempt 2 of a max_attempts=2 task lost its worker: FAILED, reason dead-lettered."""
        _, report = lose_twice()
        job = Job.objects.get(key="twice/1")
        assert report.as_dict() == {"dead_lettered": {"tests.reaper.twice": 1}}
        assert (job.state, job.attempt) == ("FAILED", 2) and len(sent) == 1
        assert "max_attempts 2" in job.error["message"]
        assert last("twice/1", "dead_lettered").reason.startswith("dead-lettered")
        assert list(Job.objects.dead_lettered()) == [job]

    def test_a_reset_job_gets_a_fresh_attempt_budget(self, backend, sent):
        """After an operator reset, attempts count from the reset, not from the first claim."""
        intent, _ = lose_twice()  # dead-lettered at attempt 2
        job = Job.objects.get(key="twice/1")
        assert backend.apply(Change(job.id, "reset", State.FAILED, attempt=2,
                                    reason="operator"), timezone.now())
        with freeze_time("2030-01-01 12:04:00"):
            claim(intent, task_id="t-3")
        report = reap_at("2030-01-01 12:05:01")
        assert report.as_dict() == {"released": {"tests.reaper.twice": 1}}

    def test_a_reset_clears_the_dead_lettered_mark_and_a_plain_failure_sets_none(
            self, backend, sent):
        """The mark is the row's (states.MOVES): set by the dead_lettered move, cleared
        by an operator's reset; the next failure of the key is an ordinary one, though
        the history still holds the earlier dead_lettered line."""
        intent, _ = lose_twice()  # dead-lettered at attempt 2
        job = Job.objects.get(key="twice/1")
        assert job.dead_lettered and list(Job.objects.dead_lettered()) == [job]
        assert backend.apply(Change(job.id, "reset", State.FAILED, attempt=2,
                                    reason="operator"), timezone.now())
        assert not Job.objects.get(key="twice/1").dead_lettered
        with freeze_time("2030-01-01 12:04:00"):
            assert claim(intent, task_id="t-3").fail(ValueError("boom"))
        job = Job.objects.get(key="twice/1")
        assert (job.state, job.dead_lettered) == (State.FAILED, False)
        assert list(Job.objects.dead_lettered()) == []
        assert list(Job.objects.not_dead_lettered()) == [job]
        assert last("twice/1", "dead_lettered") is not None

    def test_a_task_that_must_not_rerun_blindly_becomes_uncertain(self, backend, sent):
        """on_stale_claim="uncertain": RUNNING -> UNCERTAIN, never re-dispatched."""
        with freeze_time(T0):
            claim(publish(send_mail))
        report = reap_at("2030-01-01 13:00:00")
        job = Job.objects.get(key="mail/1")
        assert report.as_dict() == {"uncertain": {"tests.reaper.send_mail": 1}}
        assert job.state == State.UNCERTAIN and sent == []
        assert "must not re-run blindly" in last("mail/1", "uncertain").reason
        assert reap_at("2030-01-02 13:00:00").as_dict() == {}

    def test_a_task_unknown_to_this_process_is_skipped(self, backend, sent):
        """Without the task's declarations the pass does not guess: it leaves the claim."""
        with freeze_time(T0):
            claim(publish())
        Job.objects.filter(key="ship/1").update(task_name="gone.task")
        report = reap_at("2030-01-01 13:00:00")
        assert report.as_dict() == {"skipped": {"gone.task": 1}}
        assert Job.objects.get(key="ship/1").state == State.RUNNING


class TestLostMessages:
    def test_pending_past_the_dispatch_timeout_is_sent_again(self, backend, sent):
        """A PENDING intent nobody claimed within the timeout: re-dispatched and counted."""
        with freeze_time(T0):
            publish()
        assert reap_at("2030-01-01 12:09:59").as_dict() == {}
        report = reap_at("2030-01-01 12:10:01")
        job = Job.objects.get(key="ship/1")
        assert report.as_dict() == {"redispatched": {ship_order.name: 1}}
        assert (job.state, job.dispatch_count) == ("PENDING", 1)
        assert sent == [("ship/1", job.task_id)]
        assert "presumed lost" in last("ship/1", "redispatched").reason

    def test_redispatches_back_off(self, backend, sent):
        """The wait doubles with each re-dispatch: 600 s, then 1200 s, then 2400 s."""
        with freeze_time(T0):
            publish()
        reap_at("2030-01-01 12:10:01")
        assert reap_at("2030-01-01 12:20:02").as_dict() == {}  # 600 s after: too early
        assert reap_at("2030-01-01 12:30:02").total("redispatched") == 1  # 1200 s after
        assert reap_at("2030-01-01 13:00:01").as_dict() == {}  # 1799 s after
        assert reap_at("2030-01-01 13:10:03").total("redispatched") == 1  # 2400 s after
        assert Job.objects.get(key="ship/1").dispatch_count == 3 and len(sent) == 3

    def test_backoff_is_capped(self):
        """The wait never exceeds CELERY_IDEM_DISPATCH_MAX_BACKOFF."""
        assert [due.redispatch_wait(n) for n in range(5)] == [600, 1200, 2400, 2400, 2400]

    def test_a_scheduled_retry_is_not_sent_before_its_not_before(self, backend, sent):
        """A retry due in an hour gets the full timeout after its ETA, not after its write."""
        with freeze_time(T0):
            intent = publish()
            held = claim(intent)
            held.schedule_retry(timezone.now() + timedelta(hours=1), "retry: later")
        assert reap_at("2030-01-01 12:30:00").as_dict() == {}
        assert reap_at("2030-01-01 13:09:59").as_dict() == {}
        assert reap_at("2030-01-01 13:10:01").total("redispatched") == 1

    def test_claimed_jobs_are_not_sent_again(self, backend, sent):
        """A job claimed meanwhile is RUNNING under a live lease: nothing to do."""
        with freeze_time(T0):
            intent = publish()
        with freeze_time("2030-01-01 12:30:00"):
            claim(intent, lease=3600)
        assert reap_at("2030-01-01 12:31:00").as_dict() == {} and sent == []

    def test_a_failed_send_is_retried_by_the_next_pass(self, backend, monkeypatch):
        """The broker refuses: reported, the job stays PENDING, a later pass sends it."""
        with freeze_time(T0):
            publish()

        def refuse(job, countdown=None, task_id=None):
            raise ConnectionError("broker down")

        monkeypatch.setattr(reaper, "redispatch", refuse)
        report = reap_at("2030-01-01 12:10:01")
        assert report.total("send_failed") == 1 and report.total("redispatched") == 1
        calls = []
        monkeypatch.setattr(reaper, "redispatch",
                            lambda job, countdown=None, task_id=None: calls.append(task_id))
        assert reap_at("2030-01-01 12:40:02").total("redispatched") == 1 and len(calls) == 1

    def test_jobs_without_stored_arguments_are_skipped(self, backend, sent):
        """STORE_ARGUMENTS off: the message cannot be rebuilt, so the pass reports it."""
        with freeze_time(T0):
            publish()
        Job.objects.filter(key="ship/1").update(args=None, kwargs=None)
        assert reap_at("2030-01-01 13:00:00").as_dict() == {"skipped": {ship_order.name: 1}}
        assert sent == []

    def test_finished_jobs_are_never_touched(self, backend, sent):
        """SUCCEEDED and FAILED rows are outside both sweeps."""
        with freeze_time(T0):
            claim(publish(n=1)).succeed(1)
            claim(publish(n=2)).fail(ValueError("no"))
        assert reap_at("2031-01-01").as_dict() == {} and sent == []


class TestBatches:
    def test_a_pass_walks_every_batch(self, backend, sent):
        """Seven stale claims with a batch size of three: all released in one pass."""
        with freeze_time(T0):
            for n in range(7):
                claim(publish(n=n), task_id=f"t-{n}")
        report = reap_at("2030-01-01 13:00:00", batch_size=3)
        assert report.total("released") == 7 and len(sent) == 7
        assert set(Job.objects.values_list("state", flat=True)) == {"PENDING"}

    def test_re_dispatch_uses_the_stored_arguments_key_and_routing(self, backend, monkeypatch):
        """The message carries the stored args, the key header, the queue and priority."""
        calls = []
        monkeypatch.setattr(dispatch.current_app, "send_task",
                            lambda name, **kw: calls.append((name, kw)))
        with freeze_time(T0):
            claim(publish(n=5, options={"queue": "orders", "priority": 7}))
        reap_at("2030-01-01 13:00:00")
        (name, kwargs), = calls
        job = Job.objects.get(key="ship/5")
        assert name == ship_order.name
        assert (kwargs["args"], kwargs["kwargs"], kwargs["headers"]) == \
            ([5], {}, {HEADER: "ship/5"})
        assert (kwargs["queue"], kwargs["priority"], kwargs["task_id"]) == \
            ("orders", 7, job.task_id)


def test_two_concurrent_passes_release_each_stale_claim_once(backend, sent):
    """Two passes at once over 120 stale claims: each released and sent exactly once."""
    _two_concurrent_passes(sent)


def test_without_skip_locked_two_passes_wait_for_each_other_and_release_each_once(
        backend, sent, monkeypatch):
    """MariaDB < 10.6 and MySQL < 8.0.1 have no SKIP LOCKED: the batch is taken with a
    plain FOR UPDATE, so a concurrent pass waits for it instead of skipping it, and then
    finds those rows no longer stale. Run on MariaDB with the feature turned off."""
    if connection.vendor != "mysql":
        pytest.skip("the FOR UPDATE fallback is for MySQL/MariaDB servers without SKIP LOCKED")
    # Every thread's connection gets new features: patch the class.
    monkeypatch.setattr(type(connection.features), "has_select_for_update_skip_locked", False)
    _two_concurrent_passes(sent)


def _two_concurrent_passes(sent):
    for n in range(120):
        claim(publish(n=n), task_id=f"t-{n}")
    start = threading.Barrier(2)
    reports, errors = [], []

    def one_pass():
        try:
            start.wait()
            reports.append(reaper.reap(now=timezone.now() + timedelta(days=1), batch_size=10))
        except Exception as exc:  # surfaced below: a thread cannot fail the test itself
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one_pass) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert sum(r.total("released") for r in reports) == 120
    assert len(sent) == 120 and len({key for key, _ in sent}) == 120
    assert Transition.objects.filter(event="released").count() == 120


class TestTransitionBatch:
    """The backend step behind a batch: each move conditional, with its history row."""

    def test_matching_moves_are_made_and_a_fenced_one_is_not(self, backend):
        with freeze_time(T0):
            running = [claim(publish(n=n), task_id=f"t-{n}") for n in range(3)]
        ids = [c.job_id for c in running]
        moves = [
            Change(ids[0], "released", State.RUNNING, 1,
                      values={"lease_expires_at": None, "worker": "", "task_id": "new-0",
                       "dispatch_count": 1}, worker="host/1", task_id="t-0", reason="lost 0"),
            # attempt 7 no longer holds the claim: this one must not move
            Change(ids[1], "released", State.RUNNING, 7,
                      values={"lease_expires_at": None, "worker": "", "task_id": "new-1",
                       "dispatch_count": 1}, reason="lost 1"),
            Change(ids[2], "dead_lettered", State.RUNNING, 1,
                      values={"lease_expires_at": None, "finished_at": timezone.now(),
                       "error": {"type": "DeadLettered", "message": "é"}}, reason="dead"),
        ]
        assert backend.apply_batch(moves, timezone.now()) == {ids[0], ids[2]}
        jobs = {j.id: j for j in Job.objects.all()}
        assert (jobs[ids[0]].state, jobs[ids[0]].task_id, jobs[ids[0]].dispatch_count,
                jobs[ids[0]].worker) == (State.PENDING, "new-0", 1, "")
        assert jobs[ids[1]].state == State.RUNNING and jobs[ids[1]].task_id == "t-1"
        assert jobs[ids[2]].state == State.FAILED
        assert jobs[ids[2]].error == {"type": "DeadLettered", "message": "é"}
        released = Transition.objects.get(job_id=ids[0], event="released")
        assert (released.from_state, released.to_state, released.attempt, released.worker,
                released.task_id, released.reason) == \
            ("RUNNING", "PENDING", 1, "host/1", "t-0", "lost 0")
        assert not Transition.objects.filter(job_id=ids[1], event="released").exists()
        assert Transition.objects.get(job_id=ids[2], event="dead_lettered").reason == "dead"

    def test_a_move_the_table_forbids_is_refused(self, backend):
        with freeze_time(T0):
            job_id = claim(publish()).job_id
        with pytest.raises(InvalidTransition):
            backend.apply_batch(
                [Change(job_id, "reset", State.RUNNING, 1)], timezone.now())


def test_a_pass_over_many_jobs_of_unknown_tasks_imports_the_task_modules_once(
        monkeypatch, sent):
    """A renamed or deleted task's jobs cost a pass no more than known ones: the task
    modules are imported once per process (issue 20: once per job took ~15 ms each)."""
    from celery import current_app

    from celery_idem.recovery import handback

    imports: list[None] = []  # the outermost calls (Celery's Django fixup nests one)
    depth = [0]
    real = current_app.loader.import_default_modules

    def counted():
        imports.extend([None] if depth[0] == 0 else [])
        depth[0] += 1
        try:
            return real()
        finally:
            depth[0] -= 1

    monkeypatch.setattr(current_app.loader, "import_default_modules", counted)
    monkeypatch.setattr(handback, "_imported_modules", type(handback._imported_modules)())
    with freeze_time(T0):
        for n in range(5):
            claim(publish(n=n), task_id=f"t-{n}")
    Job.objects.update(task_name="gone.task")
    assert reap_at("2030-01-01 13:00:00").as_dict() == {"skipped": {"gone.task": 5}}
    assert reap_at("2030-01-01 14:00:00").as_dict() == {"skipped": {"gone.task": 5}}
    assert len(imports) == 1


def test_a_pass_resolves_each_task_name_once_and_unknown_tasks_add_no_queries(
        monkeypatch, sent):
    """Task names are resolved once per pass, not per job (two names, eight stale jobs
    in three batches: two look-ups), and a stale claim of a task no process knows costs
    the pass no query of its own: the same queries for two such jobs as for six."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    looked_up: list[str] = []
    real = reaper.registered_task
    monkeypatch.setattr(reaper, "registered_task",
                        lambda name: looked_up.append(name) or real(name))
    with freeze_time(T0):
        for n in range(8):
            claim(publish(n=n), task_id=f"t-{n}")
    Job.objects.filter(key__in=[f"ship/{n}" for n in range(4)]).update(task_name="gone.task")
    report = reap_at("2030-01-01 13:00:00", batch_size=3)
    assert report.as_dict() == {"released": {ship_order.name: 4}, "skipped": {"gone.task": 4}}
    assert sorted(looked_up) == sorted(["gone.task", ship_order.name])

    def queries_of_a_pass_over(unknown: int) -> int:
        Job.objects.all().delete()
        with freeze_time(T0):
            for n in range(unknown):
                claim(publish(n=n), task_id=f"t-{n}")
        Job.objects.update(task_name="gone.task")
        with CaptureQueriesContext(connection) as queries:
            assert reap_at("2030-01-01 13:00:00").as_dict() == {"skipped": {"gone.task": unknown}}
        return len(queries)

    assert queries_of_a_pass_over(2) == queries_of_a_pass_over(6)
