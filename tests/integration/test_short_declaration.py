"""A task declared the short way (``celery_idem.task(key=...)``) is an idempotent task on
real workers: the same key published twice runs its body once."""

from __future__ import annotations

from celery_idem.models import Job
from django_app.effects.models import Effect
from django_app.effects.tasks import pack_order

RESULT_TIMEOUT = 120


def test_a_short_declared_task_published_twice_runs_once_and_both_read_its_result(worker):
    first, second = pack_order.delay(5), pack_order.delay(5)

    assert [first.get(timeout=RESULT_TIMEOUT), second.get(timeout=RESULT_TIMEOUT)] == [
        {"packed": 5}] * 2
    assert Effect.objects.filter(key="pack/5").count() == 1
    job = Job.objects.get(key="pack/5")
    assert (job.state, job.attempt, job.task_name) == (
        "SUCCEEDED", 1, "django_app.effects.tasks.pack_order")
