"""Step checkpoints and child keys under a crash, with real worker processes: a body
SIGKILLed after step two runs only step three on its next attempt; a parent SIGKILLed after
sending two children (and before its commit) does not make them run again."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from celery_idem.conf import settings as idem_settings
from celery_idem.models import Checkpoint, Job, Transition
from celery_idem.recovery import sweep as reaper
from django_app.effects.models import Effect
from django_app.effects.tasks import notify, send_two_children, three_steps

from .workers import Worker, wait_until

TIMEOUT = 120


def later() -> datetime:
    """A clock past every lease and dispatch timeout: a killed worker's claim is stale."""
    return timezone.now() + timedelta(
        seconds=idem_settings.DEFAULT_LEASE + idem_settings.DISPATCH_TIMEOUT + 60)


def state(key: str) -> str:
    return Job.objects.get(key=key).state


@pytest.fixture
def flags(tmp_path: Path, broker_service, transactional_db) -> Path:
    return tmp_path


def test_a_body_killed_after_step_two_runs_only_step_three_next(flags):
    """Attempt 1 stores steps one and two and is SIGKILLed (the whole worker); after
    recovery attempt 2 gets both back from their checkpoints and runs only step three."""
    first = Worker(concurrency=2).start()
    try:
        three_steps.delay(1, str(flags))
        wait_until((flags / "steps-1.started").exists, TIMEOUT, what="step two")
    finally:
        first.kill()
    job = Job.objects.get(key="steps/1")
    assert (job.state, job.attempt) == ("RUNNING", 1)
    (flags / "steps-1").touch()
    # Nothing claims while the clock moves: the only worker is dead, the next starts after.
    assert reaper.reap(now=later()).as_dict() == {"released": {three_steps.name: 1}}
    with Worker(concurrency=2):
        wait_until(lambda: state("steps/1") == "SUCCEEDED", TIMEOUT, what="success")
    runs = sorted(Effect.objects.filter(key__startswith="steps/1/")
                  .values_list("key", "attempt"))
    assert runs == [("steps/1/one", 1), ("steps/1/three", 2), ("steps/1/two", 1)]
    assert Job.objects.get(pk=job.pk).result == [
        {"step": "one", "attempt": 1}, {"step": "two", "attempt": 1},
        {"step": "three", "attempt": 2}]
    assert list(Checkpoint.objects.filter(job=job).order_by("id")
                .values_list("step", "attempt")) == [("one", 1), ("two", 1), ("three", 2)]
    steps = list(Transition.objects.filter(job=job, event="step_completed")
                 .values_list("attempt", "reason"))
    assert steps == [(1, "step 'one'"), (1, "step 'two'"), (2, "step 'three'")]


def test_children_of_a_parent_killed_before_its_commit_run_once(flags):
    """The parent sends two PER_CALL children without keys, which run, and is SIGKILLed
    (the whole worker) before its commit. After recovery attempt 2 sends them again under
    the same derived keys: each child replays its stored result instead of running."""
    first = Worker(concurrency=2).start()
    try:
        send_two_children.delay(2, str(flags))
        wait_until((flags / "family-2.started").exists, TIMEOUT, what="the children sent")
        wait_until(lambda: Job.objects.filter(parent__key="family/2",
                                              state="SUCCEEDED").count() == 2,
                   TIMEOUT, what="the children done")
    finally:
        first.kill()
    parent = Job.objects.get(key="family/2")
    assert (parent.state, parent.attempt) == ("RUNNING", 1)
    (flags / "family-2").touch()
    assert reaper.reap(now=later()).as_dict() == {"released": {send_two_children.name: 1}}
    children = list(Job.objects.filter(parent=parent))

    with Worker(concurrency=2):
        wait_until(lambda: state("family/2") == "SUCCEEDED", TIMEOUT, what="the parent")
        # Attempt 2's result is the task ids of the children it sent again: their
        # answers (a replay writes nothing to wait for) are the stored results.
        resent = Job.objects.get(key="family/2").result
        assert [notify.AsyncResult(t).get(timeout=TIMEOUT) for t in resent] == [
            "first child", "second child"]
    assert Job.objects.filter(task_name=notify.name).count() == 2
    assert sorted(c.args[1] for c in children) == ["first child", "second child"]
    for child in children:
        assert child.key.startswith("child-") and state(child.key) == "SUCCEEDED"
        assert Effect.objects.filter(key=child.key).count() == 1
