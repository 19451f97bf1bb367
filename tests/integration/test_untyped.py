"""``typing=False`` is honoured: arguments are not checked at publish, and a call that
does not fit fails on the real worker with the body's TypeError, recorded on its job."""

from __future__ import annotations

import pytest

from celery_idem.models import Job
from django_app.effects.compat_tasks import add_per_call, add_untyped
from django_app.effects.models import Effect

from .jobs import TIMEOUT


@pytest.mark.parametrize("args, kwargs", [((5,), {}), ((5,), {"wrong": 5})])
def test_an_untyped_task_with_wrong_arguments_fails_on_the_worker(worker, args, kwargs):
    result = add_untyped.apply_async(args, kwargs)
    with pytest.raises(TypeError):
        result.get(timeout=TIMEOUT)
    assert result.status == "FAILURE"
    job = Job.objects.get()
    assert job.state == "FAILED" and "TypeError" in str(job.error)
    assert (job.args, job.kwargs) == (list(args), kwargs)
    assert not Effect.objects.exists()


def test_an_untyped_task_with_right_arguments_runs_once(worker):
    assert add_untyped.delay(2, 3).get(timeout=TIMEOUT) == 5
    assert add_untyped.delay(2, y=3).get(timeout=TIMEOUT) == 5  # the same arguments bound
    assert Effect.objects.count() == 1


def test_a_typed_task_refuses_wrong_arguments_at_the_call(worker):
    with pytest.raises(TypeError):
        add_per_call.apply_async((5,), idempotency_key="typed/1")
    assert not Job.objects.exists()
