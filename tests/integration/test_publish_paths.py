"""Every way of publishing reaches a real worker with its key: canvas, send_task, retries."""

from __future__ import annotations

from celery import chain, group

from celery_idem.models import Job, Transition
from django_app.celery import app
from django_app.effects.models import Effect
from django_app.effects.tasks import add, flaky, ship_order

TIMEOUT = 120


def test_chain_and_group_run_each_key_once(worker):
    """A chain's second task is keyed in the worker; a group's members each once."""
    assert chain(add.s(1, 2), add.s(3)).apply_async().get(timeout=TIMEOUT) == 6
    assert group(add.s(i, 1) for i in range(3)).apply_async().get(timeout=TIMEOUT) == [1, 2, 3]
    assert group(add.s(i, 1) for i in range(3)).apply_async().get(timeout=TIMEOUT) == [1, 2, 3]
    assert Job.objects.filter(task_name=add.name, state="SUCCEEDED").count() == 5
    assert Effect.objects.count() == 5


def test_send_task_by_name_is_keyed_by_the_publish_hook(worker):
    """send_task skips apply_async; the key still comes from the hook and dedupes."""
    first = app.send_task(ship_order.name, args=(314,))
    second = app.send_task(ship_order.name, args=(314,))
    expected = {"shipped": 314, "attempt": 1}
    assert first.get(timeout=TIMEOUT) == second.get(timeout=TIMEOUT) == expected
    assert Effect.objects.filter(key="ship/314").count() == 1


def test_self_retry_on_a_worker_claims_the_next_attempt(worker):
    """The retry message re-claims as attempt 2 and the history shows the retry."""
    assert flaky.delay(11, failures=1).get(timeout=TIMEOUT) == {"n": 11, "attempt": 2, "retries": 1}
    events = list(Transition.objects.filter(job__key="flaky/11").values_list("event", flat=True))
    assert events == ["retry_scheduled"]  # claims and the success are on the row
    job = Job.objects.get(key="flaky/11")
    assert (job.state, job.attempt) == ("SUCCEEDED", 2)
