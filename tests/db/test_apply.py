"""Eager ``task.apply()``: with a key it claims and commits like a worker (once per key);
a PER_CALL task applied without one runs as a plain call and writes no row."""

from __future__ import annotations

import pytest

from celery_idem import InvalidKey
from celery_idem.models import Job
from django_app.effects.compat_tasks import add_per_call
from django_app.effects.models import Effect
from django_app.effects.tasks import add

pytestmark = pytest.mark.django_db(transaction=True)


def test_apply_with_a_key_runs_once_per_key(backend):
    assert add_per_call.apply((1, 2), idempotency_key="eager/1").get() == 3
    assert add_per_call.apply((1, 2), idempotency_key="eager/1").get() == 3
    job = Job.objects.get(key="eager/1")
    assert (job.state, job.result) == ("SUCCEEDED", 3)
    assert Effect.objects.count() == 1


def test_apply_of_a_per_call_task_without_a_key_is_a_plain_call(backend):
    assert add_per_call.apply((1, 2)).get() == 3
    assert add_per_call.apply((1, 2)).get() == 3
    assert not Job.objects.exists()
    assert Effect.objects.count() == 2


def test_apply_of_a_task_that_makes_its_own_key_claims_it(backend):
    assert add.apply((4, 5)).get() == add.apply((4, 5)).get() == 9
    assert Job.objects.get().state == "SUCCEEDED"
    assert Effect.objects.count() == 1


def test_apply_refuses_a_bad_key():
    with pytest.raises(InvalidKey):
        add_per_call.apply((1, 2), idempotency_key="")


@pytest.fixture
def eager():
    from celery import current_app

    current_app.conf.task_always_eager = True
    yield
    current_app.conf.task_always_eager = False


def test_an_eager_delay_writes_its_intent_before_the_body_once(backend, eager):
    """``delay`` under ``task_always_eager``: the intent is written, once, before the body
    runs, so the body's claim takes it from PENDING as a worker's would (not inserting
    it, as for a message no producer wrote); a second call replays."""
    from celery_idem.signals import transition

    moves = []

    def seen(sender=None, event=None, from_state=None, **_):
        moves.append((event, from_state))

    transition.connect(seen)
    try:
        assert add.delay(6, 7).get() == 13
    finally:
        transition.disconnect(seen)
    assert moves == [("published", None), ("claimed", "PENDING"), ("succeeded", "RUNNING")]
    job = Job.objects.get()
    assert (job.state, job.attempt, job.result) == ("SUCCEEDED", 1, 13)
    assert add.delay(6, 7).get() == 13
    assert Effect.objects.count() == 1


def test_an_eager_delay_with_other_arguments_under_a_key_raises_before_the_body(
        backend, eager):
    from celery_idem import KeyMismatch

    assert add_per_call.apply_async((1, 2), idempotency_key="eager/mismatch").get() == 3
    with pytest.raises(KeyMismatch):
        add_per_call.apply_async((1, 3), idempotency_key="eager/mismatch")
    assert Effect.objects.count() == 1
