"""Every path that hands a lost claim back applies the task's declaration: the
worker-lost hook, the worker's shutdown, the recovery pass and an operator's release.
``on_stale_claim="uncertain"`` ends UNCERTAIN on each; ``max_attempts`` counts on each."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from celery import shared_task
from django.utils import timezone

from celery_idem import IdempotentTask, actions, claims
from celery_idem.models import Job
from celery_idem.producer import KEY_HEADER, write_intent
from celery_idem.recovery import sweep
from celery_idem.recovery import worker as hooks
from django_app.effects.path_tasks import uncertain_send

pytestmark = pytest.mark.django_db(transaction=True)


@shared_task(base=IdempotentTask, bind=True, idempotency_key="once/{name}", max_attempts=1,
             name="tests.one_attempt")
def one_attempt(self, name, folder=""):
    return name


def lost(task, intent, monkeypatch):
    req = SimpleNamespace(id="t-1", request_dict={KEY_HEADER: intent.key},
                          hostname="w1@host", worker_pid=101, args=[], kwargs={}, task=task,
                          name=task.name)
    hooks.hand_back_lost_attempt(task, req, "worker lost: SIGKILL")


def shutdown(task, intent, monkeypatch):
    monkeypatch.setattr(hooks, "_pool_pids", {101})
    hooks.on_worker_shutdown(sender=SimpleNamespace(hostname="w1@host"))


def recovery(task, intent, monkeypatch):
    sweep.reap(now=timezone.now() + timedelta(seconds=7200))


def operator(task, intent, monkeypatch):
    actions.release(Job.objects.get(key=intent.key), actor="op")


PATHS = [lost, shutdown, recovery, operator]


def held(task):
    intent = task.intent(("x", ""), {})
    write_intent(intent, "t-1")
    _, claim = claims.acquire(intent, worker="w1@host/101", task_id="t-1",
                              lease_seconds=3600, using="default")
    assert claim is not None
    return intent


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.__name__)
def test_uncertain_on_every_path(path, monkeypatch):
    intent = held(uncertain_send)
    path(uncertain_send, intent, monkeypatch)
    job = Job.objects.get(key=intent.key)
    assert (job.state, job.attempt, job.worker) == ("UNCERTAIN", 1, "")


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.__name__)
def test_max_attempts_counts_on_every_path(path, monkeypatch):
    intent = held(one_attempt)
    path(one_attempt, intent, monkeypatch)
    job = Job.objects.get(key=intent.key)
    assert job.state == "FAILED" and "DeadLettered" in job.error["message"]
