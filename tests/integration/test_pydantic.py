"""Celery's ``pydantic=True`` tasks on a real worker: a model argument is stored and
fingerprinted as the JSON Celery sends, the model result as the JSON Celery returns."""

from __future__ import annotations

import pytest

from celery_idem.models import Job
from django_app.effects.models import Effect
from django_app.effects.pydantic_tasks import Numbers, add_models

from .jobs import TIMEOUT


@pytest.mark.skipif(getattr(add_models, "_dump_pydantic_arguments", None) is None,
                    reason="Celery before 5.7 sends no model: callers pass dicts")
def test_a_model_argument_is_the_json_celery_sends(worker):
    first = add_models.apply_async((Numbers(x=1, y=2),), idempotency_key="models/1")
    assert first.get(timeout=TIMEOUT) == {"total": 3}
    job = Job.objects.get(key="models/1")
    assert (job.args, job.result) == ([{"x": 1, "y": 2}], {"total": 3})
    # The same call as the dict the message carries is the same call: a duplicate.
    again = add_models.apply_async(({"x": 1, "y": 2},), idempotency_key="models/1")
    assert again.get(timeout=TIMEOUT) == {"total": 3}
    assert Effect.objects.count() == 1


def test_a_dict_argument_is_validated_into_the_model_on_the_worker(worker):
    assert add_models.apply_async(({"x": 5, "y": 6},), idempotency_key="models/2").get(
        timeout=TIMEOUT) == {"total": 11}
    assert Job.objects.get(key="models/2").result == {"total": 11}
