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
