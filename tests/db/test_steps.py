"""Step checkpoints in process (``apply``, as a worker runs a message) and child links:
a step runs once per job, a zombie's step is refused, values must be JSON, an atomic
body's steps share its transaction, and an operator's retry keeps or clears them."""

from __future__ import annotations

import threading
from datetime import timedelta
from io import StringIO

import pytest
from celery import shared_task
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.urls import reverse
from django.utils import timezone

from celery_idem import ClaimLost, IdempotentTask, StepNotJSON, actions, claims
from celery_idem.backends import Change, Claimant, get_backend
from celery_idem.models import Checkpoint, Job, Transition
from celery_idem.producer import KEY_HEADER
from celery_idem.states import State, StepWrite
from celery_idem.steps import run_step
from django_app.effects.models import Effect
from django_app.effects.tasks import notify, send_two_children, three_steps
from tests.integration.workers import wait_until

from .lock_waits import POLL_SECONDS, ROW_LOCKING, lock_waiters

pytestmark = pytest.mark.django_db(transaction=True)

#: Step names that raise, for the next run only of ``flaky_steps``.
FAIL: set[str] = set()


def _effect(key: str, name: str) -> str:
    Effect.objects.create(key=f"{key}/{name}")
    if name in FAIL:
        FAIL.discard(name)
        raise RuntimeError(f"step {name} failed")
    return name


@shared_task(base=IdempotentTask, bind=True, idempotency_key="flaky-steps/{n}",
             name="tests.flaky_steps")
def flaky_steps(self, n):
    return [self.step(name, _effect, self.idempotency_key, name) for name in ("a", "b")]


@shared_task(base=IdempotentTask, bind=True, idempotency_key="ordered-step/{n}",
             name="tests.ordered_step")
def ordered_step(self, n):
    """A step whose value is an object, then a failure (once) after it."""
    value = self.step("order", _ordered_value)
    if "after" in FAIL:
        FAIL.discard("after")
        raise RuntimeError("the body failed after its step")
    return value


def _ordered_value():
    Effect.objects.create(key=f"ordered/{len(Effect.objects.all())}")
    return {"zeta": 1, "alpha": {"y": 2, "b": 3}, "mid": [1, "2"]}


@shared_task(base=IdempotentTask, bind=True, atomic=True, idempotency_key="atomic-steps/{n}",
             name="tests.atomic_steps")
def atomic_steps(self, n, fail=False):
    self.step("a", _effect, self.idempotency_key, "a")
    if fail:
        raise RuntimeError("the body failed after its step")
    return n


@shared_task(base=IdempotentTask, bind=True, idempotency_key="bad-step/{n}",
             name="tests.bad_step")
def bad_step(self, n):
    return self.step("bad", lambda: object())


def run(task, *args):
    return task.apply(args=args, headers={KEY_HEADER: task.intent(args).key})


def runs(key: str) -> dict[str, int]:
    """How often each step of ``key`` ran."""
    counts: dict[str, int] = {}
    for effect_key in Effect.objects.filter(key__startswith=f"{key}/").values_list("key",
                                                                                   flat=True):
        name = effect_key.rsplit("/", 1)[1]
        counts[name] = counts.get(name, 0) + 1
    return counts


def test_a_retried_job_skips_completed_steps_unless_they_are_cleared(backend):
    """Step b fails: FAILED with step a stored. A retry runs only b; a retry from scratch
    (clear_steps) runs both again."""
    FAIL.add("b")
    assert run(flaky_steps, 1).state == "FAILURE"
    job = Job.objects.get(key="flaky-steps/1")
    assert job.state == "FAILED" and runs(job.key) == {"a": 1, "b": 1}
    assert list(job.checkpoints.values_list("step", "value", "attempt")) == [("a", "a", 1)]
    assert actions.retry(job, actor="op", dispatch=False).done
    assert run(flaky_steps, 1).get() == ["a", "b"]
    assert runs(job.key) == {"a": 1, "b": 2}
    events = list(Transition.objects.filter(job=job).values_list("event", "attempt"))
    assert events.count(("step_completed", 1)) == 1 and ("step_completed", 2) in events


def test_a_stored_step_value_comes_back_as_it_was_returned_keys_in_order(backend):
    """The re-run after a failure reads the step from its checkpoint: the same JSON, the
    object's keys in the order the step returned them (not jsonb's)."""
    FAIL.add("after")
    assert run(ordered_step, 1).state == "FAILURE"
    job = Job.objects.get(key="ordered-step/1")
    assert actions.retry(job, actor="op", dispatch=False).done
    value = run(ordered_step, 1).get()
    assert Effect.objects.filter(key__startswith="ordered/").count() == 1  # read, not re-run
    assert value == {"zeta": 1, "alpha": {"y": 2, "b": 3}, "mid": [1, "2"]}
    assert list(value) == ["zeta", "alpha", "mid"] and list(value["alpha"]) == ["y", "b"]


def test_idem_retry_clear_steps_runs_every_step_again(backend, monkeypatch):
    """--clear-steps deletes the steps with the reset, so the next attempt runs them all."""
    monkeypatch.setattr(actions, "redispatch", lambda job, countdown=None, task_id=None: "t")
    FAIL.add("b")
    run(flaky_steps, 2)
    call_command("idem_retry", "--key-prefix", "flaky-steps/2", "--clear-steps",
                 stdout=StringIO())
    job = Job.objects.get(key="flaky-steps/2")
    assert job.state == "PENDING" and not job.checkpoints.exists()
    assert "completed steps cleared" in job.transitions.get(event="reset").reason
    assert run(flaky_steps, 2).get() == ["a", "b"]
    assert runs(job.key) == {"a": 2, "b": 2}


def test_a_zombie_attempt_cannot_store_a_step(backend, make_intent):
    """Attempt 1 lost its lease and attempt 2 took over: attempt 1's step is refused
    (ClaimLost, nothing stored); attempt 2's stands, and attempt 1 reads it back."""
    past = timezone.now() - timedelta(minutes=5)
    intent = make_intent("zombie")
    backend.publish(intent, "t-0", past)
    old = backend.claim("claimed", intent, Claimant("w/1", "t-1", past,
                                                    past + timedelta(seconds=60))).row
    _, new = claims.acquire(intent, worker="w/2", task_id="t-2", lease_seconds=60,
                            using="default")
    assert new is not None and new.attempt == 2
    zombie = claims.Claim(backend, old.id, old.attempt, "w/1", "t-1", 60)
    with pytest.raises(ClaimLost):
        run_step(zombie, "ocr", lambda: "zombie text", (), {})
    assert backend.read_step(old.id, "ocr") == (False, None)
    assert run_step(new, "ocr", lambda: "text", (), {}) == "text"
    assert run_step(zombie, "ocr", lambda: "other", (), {}) == "text"  # read, not written
    assert list(Checkpoint.objects.filter(job_id=old.id).values_list("value", "attempt")) == [
        ("text", 2)]


def test_a_step_value_that_is_not_json_fails_the_job_and_stores_nothing(backend):
    outcome = run(bad_step, 1)
    assert isinstance(outcome.result, StepNotJSON)
    job = Job.objects.get(key="bad-step/1")
    assert job.state == "FAILED" and job.error["type"] == "StepNotJSON"
    assert not job.checkpoints.exists()


def test_steps_of_an_atomic_body_commit_and_roll_back_with_it(backend):
    assert run(atomic_steps, 1, True).state == "FAILURE"
    assert not Checkpoint.objects.filter(job__key="atomic-steps/1").exists()
    assert run(atomic_steps, 2).get() == 2
    assert list(Checkpoint.objects.filter(job__key="atomic-steps/2")
                .values_list("step", "attempt")) == [("a", 1)]


def test_called_as_a_function_a_step_just_runs(backend):
    """A plain call of the task (a unit test of its body) has no claim: nothing stored."""
    assert [s["step"] for s in three_steps(5)] == ["one", "two", "three"]
    assert not Checkpoint.objects.exists() and runs("steps/5") == {"one": 1, "two": 1,
                                                                   "three": 1}


def test_children_sent_from_a_body_get_derived_keys_and_a_parent_link(backend):
    run(send_two_children, 3)
    parent = Job.objects.get(key="family/3")
    children = list(Job.objects.filter(task_name=notify.name).order_by("id"))
    assert [c.args for c in children] == [[3, "first child"], [3, "second child"]]
    assert all(c.key.startswith("child-") and c.parent_id == parent.pk for c in children)
    run(send_two_children, 3)  # a duplicate replays: no new children
    assert Job.objects.filter(parent=parent).count() == 2
    assert actions.forget(parent, actor="op").done  # the children stay, unlinked
    assert Job.objects.filter(task_name=notify.name, parent__isnull=True).count() == 2


def test_admin_links_parent_and_children_and_retries_from_scratch(backend, admin_client,
                                                                   monkeypatch):
    """Both jobs' pages link each other; a failed job's steps are listed, and "Retry from
    scratch" resets it with its steps cleared."""
    monkeypatch.setattr(actions, "redispatch", lambda job, countdown=None, task_id=None: "t")
    run(send_two_children, 4)
    parent = Job.objects.get(key="family/4")
    children = list(Job.objects.filter(parent=parent))

    def page(job):
        return admin_client.get(reverse("admin:celery_idem_job_change", args=[job.pk]))

    html = page(parent).content.decode()
    assert len(children) == 2
    for child in children:
        assert reverse("admin:celery_idem_job_change", args=[child.pk]) in html
        back = page(child).content.decode()
        assert reverse("admin:celery_idem_job_change", args=[parent.pk]) in back
    FAIL.add("b")
    run(flaky_steps, 3)
    failed = Job.objects.get(key="flaky-steps/3")
    response = page(failed)
    assert [c["step"] for c in response.context["checkpoints"]] == ["a"]
    assert "retry_from_scratch_selected" in [a["name"] for a in response.context["job_actions"]]
    admin_client.post(reverse("admin:celery_idem_job_changelist"), {
        "action": "retry_from_scratch_selected", ACTION_CHECKBOX_NAME: [failed.pk]})
    assert Job.objects.get(pk=failed.pk).state == "PENDING" and not failed.checkpoints.exists()
    changelist = admin_client.get(reverse("admin:celery_idem_job_changelist"),
                                  {"parent__id__exact": parent.pk})
    assert changelist.status_code == 200 and changelist.context["cl"].result_count == 2


@pytest.mark.skipif(connection.vendor not in ROW_LOCKING,
                    reason="SQLite has one writer at a time: there is no row lock to observe")
def test_a_zombie_step_racing_a_take_over_waits_for_it_and_is_refused(make_intent):
    """The take-over is in flight (not yet committed) when the zombie writes its step: the
    step's statement waits for the row and, once the take-over commits, matches nothing."""
    backend, past = get_backend("default"), timezone.now() - timedelta(minutes=5)
    intent = make_intent("race")
    backend.publish(intent, "t-0", past)
    old = backend.claim("claimed", intent, Claimant("w/1", "t-1", past,
                                                    past + timedelta(seconds=60))).row
    written: list[StepWrite] = []

    def zombie() -> None:  # its own session: Django's connections are per thread
        try:
            written.append(backend.save_step(
                Change(old.id, "step_completed", State.RUNNING, attempt=1), "ocr", 1,
                timezone.now()))
        finally:
            connections.close_all()

    def waiting() -> bool:
        return lock_waiters() == 1

    now = timezone.now()
    with transaction.atomic():
        assert backend.claim("taken_over", intent, Claimant("w/2", "t-2", now,
                                                            now + timedelta(seconds=60))).won
        thread = threading.Thread(target=zombie)
        thread.start()
        wait_until(waiting, 30, POLL_SECONDS, what="the zombie's step waiting for the row")
    thread.join(30)
    assert written == [StepWrite.FENCED]
    assert not Checkpoint.objects.filter(job_id=old.id).exists()
