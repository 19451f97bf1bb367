"""Claim and commit against the database: fencing, lost claims, retries, replays."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from freezegun import freeze_time

from celery_idem import claims
from celery_idem.backends import Change
from celery_idem.errors import ClaimLost, KeyMismatch
from celery_idem.history import path_errors
from celery_idem.models import Job, Transition
from celery_idem.producer import write_intent
from celery_idem.states import State
from django_app.effects.models import Effect

pytestmark = pytest.mark.django_db


def acquire(intent, task_id="task-1", worker="w1", lease=60):
    return claims.acquire(intent, worker=worker, task_id=task_id, lease_seconds=lease,
                          using="default")


def events(key="k1"):
    return list(Transition.objects.filter(job__key=key).order_by("id")
                .values_list("event", "from_state", "to_state", "attempt"))


class TestPublish:
    def test_publish_writes_one_pending_intent_and_no_history(self, backend, make_intent):
        """The first publish inserts PENDING; a second with the same arguments is a no-op."""
        write_intent(make_intent(), "task-1")
        write_intent(make_intent(), "task-2")
        job = Job.objects.get(key="k1")
        assert (job.state, job.attempt, job.args) == ("PENDING", 0, [1])
        assert job.options == {"queue": "q"} and job.created_at is not None
        assert events() == []  # the row says when it was published

    def test_publish_with_other_arguments_raises_key_mismatch(self, backend, make_intent):
        """Same key, different fingerprint: refused before sending, row untouched."""
        write_intent(make_intent(), "task-1")
        with pytest.raises(KeyMismatch, match="k1"):
            write_intent(make_intent(fingerprint="fp-2"), "task-2")
        assert Job.objects.get(key="k1").fingerprint == "fp-1"


class TestClaim:
    def test_first_claim_wins_and_bumps_the_attempt(self, backend, make_intent):
        """PENDING -> RUNNING with attempt 1, worker, task id and a lease."""
        write_intent(make_intent(), "task-1")
        outcome, claim = acquire(make_intent())
        job = Job.objects.get(key="k1")
        assert outcome.won and claim.attempt == 1
        assert (job.state, job.attempt, job.worker, job.task_id) == ("RUNNING", 1, "w1", "task-1")
        assert job.lease_expires_at > timezone.now() and job.started_at is not None
        assert events() == []  # the row holds the claim: attempt, worker, started_at

    def test_claim_without_an_intent_inserts_the_row_running(self, backend, make_intent):
        """A message whose intent was never written still claims, as attempt 1."""
        outcome, claim = acquire(make_intent())
        assert outcome.won and claim.attempt == 1
        job = Job.objects.get(key="k1")
        assert (job.state, job.attempt, job.worker) == ("RUNNING", 1, "w1")

    def test_second_claim_meets_the_live_claim(self, backend, make_intent):
        """A duplicate during the run loses and sees RUNNING; nothing is written for it."""
        acquire(make_intent())
        outcome, claim = acquire(make_intent(), task_id="task-2")
        assert claim is None and outcome.row.state is State.RUNNING
        job = Job.objects.get(key="k1")
        assert (job.attempt, job.task_id) == (1, "task-1") and events() == []

    def test_claim_with_other_arguments_does_not_claim(self, backend, make_intent):
        """A different fingerprint never claims; the row shows the original fingerprint."""
        write_intent(make_intent(), "task-1")
        outcome, claim = acquire(make_intent(fingerprint="fp-2"))
        assert claim is None and outcome.row.fingerprint == "fp-1"
        assert Job.objects.get(key="k1").state == "PENDING"

    def test_duplicate_of_a_succeeded_key_replays_and_writes_nothing(self, backend,
                                                                      make_intent):
        """A finished key is not claimed again; the duplicate only reads the row."""
        _, claim = acquire(make_intent())
        assert claim.succeed({"ok": True})
        before = Job.objects.values_list("updated_at", "task_id").get(key="k1")
        outcome, again = acquire(make_intent(), task_id="task-2")
        assert again is None and outcome.row.state is State.SUCCEEDED
        assert outcome.row.result == {"ok": True}
        assert Job.objects.values_list("updated_at", "task_id").get(key="k1") == before
        assert events() == []


    def test_a_claim_read_back_as_another_claims_has_lost(self, backend, backend_kind,
                                                         make_intent, monkeypatch):
        """The portable backend's claim is an UPDATE, then a read of the attempt it
        took; outside a transaction another claim can get in between (here: an operator
        hands the row to another task's claim), and this one then reports it lost."""
        if connection.vendor == "postgresql" and backend_kind == "native":
            pytest.skip("PostgreSQL's claim returns its own row (one statement)")
        write_intent(make_intent(), "task-1")
        read = type(backend)._row

        def taken_over_first(self, **lookup):
            Job.objects.filter(key="k1").update(task_id="task-2", attempt=2)
            return read(self, **lookup)

        monkeypatch.setattr(type(backend), "_row", taken_over_first)
        outcome, claim = acquire(make_intent())
        assert not outcome.won and claim is None
        assert outcome.row.task_id == "task-2"


class TestCommitAndFencing:
    def test_commit_stores_the_result_under_its_attempt(self, backend, make_intent):
        """Success: SUCCEEDED with the result, lease cleared, finished time set."""
        _, claim = acquire(make_intent())
        assert claim.succeed([1, "two"])
        job = Job.objects.get(key="k1")
        assert (job.state, job.result, job.lease_expires_at) == ("SUCCEEDED", [1, "two"], None)
        assert job.finished_at is not None

    def test_expired_claim_is_taken_over_and_the_zombie_commit_is_rejected(
            self, backend, make_intent):
        """Attempt 2 takes over an expired lease; attempt 1's late commit changes nothing."""
        with freeze_time(timezone.now() - timedelta(minutes=5)):
            _, zombie = acquire(make_intent(), lease=60)
        _, fresh = acquire(make_intent(), task_id="task-2", worker="w2")
        assert fresh.attempt == 2
        assert not zombie.succeed("zombie result")
        assert fresh.succeed("fresh result")
        job = Job.objects.get(key="k1")
        assert (job.state, job.attempt, job.result) == ("SUCCEEDED", 2, "fresh result")
        assert [e[0] for e in events()] == ["taken_over", "late_finish"]

    def test_zombie_failure_does_not_overwrite_the_newer_attempt(self, backend, make_intent):
        """A lost claim's failure is recorded as late, not as the job's outcome."""
        with freeze_time(timezone.now() - timedelta(minutes=5)):
            _, zombie = acquire(make_intent(), lease=60)
        acquire(make_intent(), task_id="task-2")
        assert not zombie.fail(ValueError("late"))
        assert Job.objects.get(key="k1").state == "RUNNING"

    def test_a_late_finish_names_the_state_the_job_is_in(self, backend, make_intent):
        """Regression (found by tests/db/test_model.py): a zombie finishing after its claim
        was handed back recorded ``late_finish RUNNING -> RUNNING`` on a PENDING job, a
        history that is no path through the move table. The line names the job's state."""
        write_intent(make_intent(), "task-1")
        _, zombie = acquire(make_intent())
        job = Job.objects.get(key="k1")
        assert backend.apply(Change(job.id, "released", State.RUNNING, attempt=1,
                                    values={"lease_expires_at": None}), timezone.now())
        assert not zombie.succeed("late")
        assert events()[-1] == ("late_finish", "PENDING", "PENDING", 1)
        lines = [e[:3] for e in events()]
        assert path_errors(lines, Job.objects.get(key="k1").state) == []
        job.delete()
        assert not zombie.fail(ValueError("after forget"))  # no row: nothing to record

    def test_atomic_zombie_commit_rolls_back_its_writes(self, backend, make_intent):
        """Attempt 1 commits after attempt 2 claimed: its body's writes roll back."""
        with freeze_time(timezone.now() - timedelta(minutes=5)):
            _, zombie = acquire(make_intent(), lease=60)
        _, fresh = acquire(make_intent(), task_id="task-2")
        with pytest.raises(ClaimLost), transaction.atomic():
            Effect.objects.create(key="k1", value="zombie")
            if not zombie.succeed("zombie"):
                raise ClaimLost("fenced out")
        with transaction.atomic():
            Effect.objects.create(key="k1", value="fresh")
            assert fresh.succeed("fresh")
        assert list(Effect.objects.values_list("value", flat=True)) == ["fresh"]
        assert Job.objects.get(key="k1").result == "fresh"

    def test_failure_is_stored_with_its_error(self, backend, make_intent):
        """FAILED keeps the exception's type, message and traceback."""
        _, claim = acquire(make_intent())
        try:
            raise ValueError("bad input")
        except ValueError as exc:
            assert claim.fail(exc)
        job = Job.objects.get(key="k1")
        assert job.state == "FAILED"
        assert (job.error["type"], job.error["message"]) == ("ValueError", "bad input")
        assert "Traceback" in job.error["traceback"]


class TestRetry:
    def test_retry_goes_back_to_pending_and_the_next_claim_is_attempt_two(
            self, backend, make_intent):
        """A scheduled retry waits for its ETA, except for its own message."""
        _, claim = acquire(make_intent())
        eta = timezone.now() + timedelta(seconds=30)
        assert claim.schedule_retry(eta, "retry: flaky")
        job = Job.objects.get(key="k1")
        assert (job.state, job.not_before) == ("PENDING", eta)
        outcome, other = acquire(make_intent(), task_id="someone-else")
        assert other is None and outcome.row.state is State.PENDING
        _, again = acquire(make_intent(), task_id="task-1")
        assert again.attempt == 2
        assert [e[0] for e in events()] == ["retry_scheduled"]
        assert Job.objects.get(key="k1").attempt == 2

    def test_anyone_may_claim_once_the_retry_eta_has_passed(self, backend, make_intent):
        """not_before only holds until it passes."""
        _, claim = acquire(make_intent())
        claim.schedule_retry(timezone.now() + timedelta(seconds=30), "retry")
        with freeze_time(timezone.now() + timedelta(seconds=31)):
            _, other = acquire(make_intent(), task_id="someone-else")
        assert other is not None and other.attempt == 2


class TestHeartbeat:
    def test_heartbeat_extends_the_lease(self, backend, make_intent):
        """The lease moves forward while the claim is held."""
        _, claim = acquire(make_intent(), lease=10)
        before = Job.objects.get(key="k1").lease_expires_at
        with freeze_time(timezone.now() + timedelta(seconds=5)):
            until = claim.heartbeat(60)
        assert until > before and Job.objects.get(key="k1").lease_expires_at == until

    def test_heartbeat_of_a_fenced_out_attempt_raises_claim_lost(self, backend, make_intent):
        """Once a newer attempt owns the key, heartbeat tells the old one to stop."""
        with freeze_time(timezone.now() - timedelta(minutes=5)):
            _, zombie = acquire(make_intent(), lease=60)
        acquire(make_intent(), task_id="task-2")
        with pytest.raises(ClaimLost):
            zombie.heartbeat()


class TestTransitionGuard:
    def test_a_move_from_the_wrong_state_matches_nothing(self, backend, make_intent):
        """A conditional write that lost its race says so and writes no history."""
        _, claim = acquire(make_intent())
        claim.succeed(1)
        assert not backend.apply(Change(claim.job_id, "released", State.RUNNING, attempt=1),
                                 timezone.now())
        assert Job.objects.get(key="k1").state == "SUCCEEDED"

    def test_a_move_the_table_forbids_raises_before_writing(self, backend, make_intent):
        """SUCCEEDED -> PENDING is not a move; asking for it raises InvalidTransition."""
        from celery_idem.errors import InvalidTransition

        _, claim = acquire(make_intent())
        claim.succeed(1)
        with pytest.raises(InvalidTransition):
            backend.apply(Change(claim.job_id, "reset", State.SUCCEEDED, attempt=1),
                          timezone.now())
        with pytest.raises(InvalidTransition):
            backend.apply(Change(claim.job_id, "succeeded", State.RUNNING, attempt=1,
                                 values={"state": "PENDING"}), timezone.now())
        with pytest.raises(InvalidTransition):
            backend.apply(Change(claim.job_id, "succeeded", State.RUNNING, values={}),
                          timezone.now())
