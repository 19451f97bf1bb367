"""Worker-side release: a lost child's claim goes back at once, conditional on its attempt."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from billiard.exceptions import WorkerLostError

from celery_idem import claims
from celery_idem.models import Job, Transition
from celery_idem.producer import KEY_HEADER as HEADER
from celery_idem.producer import write_intent
from celery_idem.recovery import worker as hooks
from django_app.effects.tasks import deduct_stock, ship_order

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(task=ship_order, n=1, task_id="t-1", worker="w1@host/101"):
    intent = task.intent((n,), {})
    write_intent(intent, task_id)
    _, claim = claims.acquire(intent, worker=worker, task_id=task_id, lease_seconds=3600,
                              using="default")
    return intent, claim


def request(intent, task_id="t-1", hostname="w1@host", pid=101, task=ship_order):
    """What the MainProcess knows about a request: id, key header, host and child pid."""
    return SimpleNamespace(id=task_id, request_dict={HEADER: intent.key}, hostname=hostname,
                           worker_pid=pid, args=[], kwargs={}, task=task, name=task.name)


def test_a_lost_child_releases_its_claim_with_the_reason():
    """WorkerLostError: RUNNING -> PENDING at once, the history says why."""
    intent, _ = claimed()
    assert hooks.hand_back_lost_attempt(ship_order, request(intent), "worker lost: SIGKILL")
    job = Job.objects.get(key=intent.key)
    assert (job.state, job.worker, job.lease_expires_at) == ("PENDING", "", None)
    row = Transition.objects.filter(job=job).last()
    assert (row.event, row.reason, row.worker) == ("released", "worker lost: SIGKILL",
                                                   "w1@host/101")


def test_a_claim_held_by_another_process_is_not_released():
    """Another child (or a newer attempt) holds the key: the lost request releases nothing."""
    intent, _ = claimed(worker="w2@host/202")
    assert not hooks.hand_back_lost_attempt(ship_order, request(intent), "worker lost")
    assert Job.objects.get(key=intent.key).state == "RUNNING"


def test_a_claim_of_another_message_is_not_released():
    """A newer message (another task id) owns the row: nothing changes."""
    intent, _ = claimed(task_id="t-2")
    assert not hooks.hand_back_lost_attempt(ship_order, request(intent), "worker lost")
    assert Job.objects.get(key=intent.key).state == "RUNNING"


def test_an_atomic_attempt_that_rolled_back_is_recorded():
    """Atomic: the claim died with the worker, so the history gets an attempt_lost line."""
    intent = deduct_stock.intent((1, 2, 3), {})
    write_intent(intent, "t-1")
    req = request(intent, task=deduct_stock)
    assert not hooks.hand_back_lost_attempt(deduct_stock, req, "worker lost")
    job = Job.objects.get(key=intent.key)
    assert job.state == "PENDING"
    assert Transition.objects.filter(job=job).last().event == "attempt_lost"


def test_the_request_class_releases_on_worker_lost(monkeypatch):
    """IdempotentRequest.on_failure calls the release for WorkerLostError, once."""
    calls = []
    monkeypatch.setattr(hooks.Request, "on_failure", lambda self, *a, **k: None)
    monkeypatch.setattr(hooks, "hand_back_lost_attempt",
                        lambda task, req, why: calls.append(why))
    req = object.__new__(hooks.IdempotentRequest)
    req._task, req._request_dict = ship_order, {"id": "t-1", "task": ship_order.name}
    monkeypatch.setattr(hooks.IdempotentRequest, "task", ship_order, raising=False)
    monkeypatch.setattr(hooks.IdempotentRequest, "id", "t-1", raising=False)
    monkeypatch.setattr(hooks.IdempotentRequest, "name", ship_order.name, raising=False)
    exc = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL)")
    req.on_failure(SimpleNamespace(exception=exc))
    req.on_failure(SimpleNamespace(exception=exc))
    assert calls == ["worker lost: WorkerLostError: Worker exited prematurely: signal 9 (SIGKILL)"]


def test_ordinary_body_failures_do_not_release(monkeypatch):
    """A body exception was already recorded by the child: the MainProcess does nothing."""
    calls = []
    monkeypatch.setattr(hooks.Request, "on_failure", lambda self, *a, **k: None)
    monkeypatch.setattr(hooks, "hand_back_lost_attempt", lambda *a: calls.append(a))
    req = object.__new__(hooks.IdempotentRequest)
    req.on_failure(SimpleNamespace(exception=ValueError("boom")))
    assert calls == []


def test_the_task_class_names_the_request_class():
    """Workers build IdempotentTask requests from IdempotentRequest."""
    assert ship_order.Request == "celery_idem.recovery.worker:IdempotentRequest"


def test_worker_shutdown_releases_claims_of_its_own_children(monkeypatch):
    """At shutdown, claims still held by this worker's children go back; others stay."""
    mine, _ = claimed(n=1, worker="w1@host/101")
    other, _ = claimed(n=2, task_id="t-2", worker="w9@elsewhere/101")
    monkeypatch.setattr(hooks, "_pool_pids", {101})
    hooks.on_worker_shutdown(sender=SimpleNamespace(hostname="w1@host"))
    assert Job.objects.get(key=mine.key).state == "PENDING"
    assert Job.objects.get(key=other.key).state == "RUNNING"
    assert "shut down" in Transition.objects.filter(job__key=mine.key).last().reason
