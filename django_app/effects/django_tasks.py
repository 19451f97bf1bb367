"""Django tasks (``django.tasks``, Django 6.0+) that celery_idem.tasks_backend runs: each
records its effect, and Django's task signals are recorded as effects too
(tests/integration/test_django_tasks.py). Listed in CELERY_IMPORTS (django_app/settings.py),
which is how the worker knows them."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import django
from django.dispatch import receiver
from django.tasks.signals import task_enqueued, task_finished, task_started

from celery_idem import PER_CALL
from celery_idem.tasks_backend import task

from .models import Effect

if django.VERSION >= (6, 1):
    # Django 6.1's @task hands options it does not know to the backend's task class.
    from django.tasks import task as declare
else:
    declare = task  # Django 6.0's @task refuses them: the backend's own decorator


def _effect(key: str, context=None, **value) -> Effect:
    return Effect.objects.create(key=key, value=value, pid=os.getpid(),
                                 attempt=context.attempt if context else None)


@declare(idempotency_key="dt-ship/{order_id}", takes_context=True)
def ship(context, order_id, hold=0.0):
    """One effect per order; ``hold`` keeps the claim that many seconds."""
    _effect(f"dt-ship/{order_id}", context, order_id=order_id)
    if hold:
        time.sleep(hold)
    return {"shipped": order_id, "attempt": context.attempt,
            "result_id": context.task_result.id}


@task(idempotency_key="dt-fail/{n}")
def fails(n):
    _effect(f"dt-fail/{n}", n=n)
    raise ValueError(f"boom {n}")


@task(idempotency_key=PER_CALL)
def notify(text):
    _effect(f"dt-notify/{text}", text=text)
    return text


@task(idempotency_key="dt-async/{n}")
async def ship_async(n):
    await asyncio.sleep(0)
    return {"async": n}


@declare(idempotency_key="dt-wait/{name}", takes_context=True)
def wait_for_file(context, name, folder):
    """Records its effect, then blocks until ``folder/name`` exists (crash tests)."""
    _effect(f"dt-wait/{name}", context, name=name)
    _hold(folder, name)
    return {"name": name, "attempt": context.attempt}


@declare(idempotency_key="dt-atomic/{name}", atomic=True, takes_context=True)
def wait_for_file_atomic(context, name, folder):
    """Atomic: its effect commits with the job or not at all; touches
    ``folder/name.started`` with its pid (the effect is invisible until the commit),
    then blocks until ``folder/name`` exists."""
    _effect(f"dt-atomic/{name}", context, name=name)
    _hold(folder, name)
    return {"name": name, "attempt": context.attempt}


def _hold(folder: str, name: str) -> None:
    Path(folder, f"{name}.started").write_text(str(os.getpid()))
    flag = Path(folder) / name
    deadline = time.monotonic() + 120
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@receiver(task_enqueued, dispatch_uid="effects.django_tasks.enqueued")
@receiver(task_started, dispatch_uid="effects.django_tasks.started")
@receiver(task_finished, dispatch_uid="effects.django_tasks.finished")
def record_signal(sender, task_result, signal, **kwargs):
    """Each signal as an effect ``signal/<name>/<result id>``: what it said, and where."""
    name = {task_enqueued: "enqueued", task_started: "started",
            task_finished: "finished"}[signal]
    Effect.objects.create(key=f"signal/{name}/{task_result.id}", pid=os.getpid(),
                          value={"status": task_result.status.value,
                                 "attempts": task_result.attempts,
                                 "sender": sender.__name__})
