"""``self.retry(args=..., kwargs=...)`` with new arguments continues the same job on a
real worker: the ``retry_scheduled`` move records them, fenced by the attempt."""

from __future__ import annotations

import pytest

from celery_idem import KeyMismatch
from celery_idem.models import Job
from django_app.effects.compat_tasks import retry_all_arguments, retry_with_new_arguments
from django_app.effects.models import Effect

from .jobs import TIMEOUT, events


def test_a_retry_with_new_arguments_continues_the_same_job(worker):
    result = retry_with_new_arguments.apply_async(kwargs={"n": 4}, idempotency_key="r/1")
    assert result.get(timeout=TIMEOUT) == 40
    job = Job.objects.get(key="r/1")
    assert (job.state, job.attempt, job.result) == ("SUCCEEDED", 2, 40)
    assert (job.args, job.kwargs) == ([4, 1], {})
    assert events("r/1") == ["retry_scheduled"]
    assert Effect.objects.count() == 2


def test_the_job_replays_for_its_new_arguments_and_refuses_the_old_ones(worker):
    """After the retry the job's arguments are the retry's: a duplicate with them
    replays, one with the arguments of before is another call under the same key."""
    retry_with_new_arguments.apply_async(kwargs={"n": 5}, idempotency_key="r/2").get(
        timeout=TIMEOUT)
    again = retry_with_new_arguments.apply_async((5, 1), idempotency_key="r/2")
    assert again.get(timeout=TIMEOUT) == 50
    with pytest.raises(KeyMismatch):
        retry_with_new_arguments.apply_async(kwargs={"n": 5}, idempotency_key="r/2")
    assert Effect.objects.count() == 2


def test_a_retry_keyed_by_all_arguments_keeps_the_first_calls_key(worker):
    assert retry_all_arguments.delay(3).get(timeout=TIMEOUT) == 30
    job = Job.objects.get()
    assert (job.state, job.attempt, job.kwargs) == ("SUCCEEDED", 2, {"n": 3, "seen": 1})
