"""``app.send_task`` of a PER_CALL task on a real worker: a key given as
``idempotency_key=`` or in the ``celery_idem_key`` header runs the body once per key; no
key fails at the call, before anything is sent."""

from __future__ import annotations

import pytest

from celery_idem import MissingKey
from celery_idem.models import Job
from django_app.celery import app
from django_app.effects.compat_tasks import add_per_call
from django_app.effects.models import Effect

from .jobs import TIMEOUT


def test_send_task_with_an_idempotency_key_runs_once_per_key(worker):
    first = app.send_task(add_per_call.name, args=(1, 2), idempotency_key="by-name/1")
    second = app.send_task(add_per_call.name, args=(1, 2),
                           headers={"celery_idem_key": "by-name/1"})
    assert first.get(timeout=TIMEOUT) == second.get(timeout=TIMEOUT) == 3
    assert Job.objects.get(key="by-name/1").state == "SUCCEEDED"
    assert Effect.objects.count() == 1


def test_send_task_without_a_key_fails_at_the_call(worker):
    with pytest.raises(MissingKey, match="send_task"):
        app.send_task(add_per_call.name, args=(1, 2))
    assert not Job.objects.exists()


def test_send_task_with_a_key_for_a_task_the_producer_does_not_know(worker):
    """No signature to fingerprint with here: the worker writes the intent it claims."""
    name = add_per_call.name
    task = app.tasks.pop(name)
    try:
        result = app.send_task(name, args=(2, 2), idempotency_key="by-name/2")
    finally:
        app.tasks[name] = task
    assert result.get(timeout=TIMEOUT) == 4
    assert Job.objects.get(key="by-name/2").state == "SUCCEEDED"
