"""The recovery pass and stale claims: a RUNNING row past its lease is released and
sent again, dead-lettered past max_attempts, made UNCERTAIN, or left to a process that
knows its task."""

from __future__ import annotations

import pytest
from celery import shared_task
from django.utils import timezone
from freezegun import freeze_time

from celery_idem import IdempotentTask
from celery_idem.backends import Change
from celery_idem.models import Job, Transition
from celery_idem.states import State
from django_app.effects.tasks import ship_order
from tests.db.reaping import T0, claim, last, publish, reap_at
from tests.db.reaping import sent as sent
from tests.db.reaping import timeouts as timeouts

pytestmark = pytest.mark.django_db(transaction=True)


@shared_task(base=IdempotentTask, bind=True, idempotency_key="twice/{n}", max_attempts=2,
             name="tests.reaper.twice")
def at_most_twice(self, n):
    return n


@shared_task(base=IdempotentTask, bind=True, idempotency_key="mail/{n}",
             on_stale_claim="uncertain", name="tests.reaper.send_mail")
def send_mail(self, n):
    return n


def events(key):
    return list(Transition.objects.filter(job__key=key).order_by("id")
                .values_list("event", flat=True))


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

