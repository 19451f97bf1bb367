"""Tasks for the call-path tests: replace, and the targets of map/starmap/chunks."""

from __future__ import annotations

import os
import time

from celery import shared_task

from celery_idem import IdempotentTask

from .models import Effect


@shared_task(bind=True)
def replacement_double(self, key, n, hold=0.0):
    """A plain task a body is replaced by: records its effect, returns ``2 * n``."""
    Effect.objects.create(key=key, pid=os.getpid())
    if hold:
        time.sleep(hold)
    return 2 * n


@shared_task(bind=True)
def replacement_fails(self, key):
    Effect.objects.create(key=key, pid=os.getpid())
    raise ValueError(f"replacement {key} failed")


@shared_task(base=IdempotentTask, bind=True, idempotency_key="replace/{n}")
def replaced_body(self, n, hold=0.0):
    """Records its effect, then replaces itself with ``replacement_double``."""
    Effect.objects.create(key=self.idempotency_key, attempt=self.attempt, pid=os.getpid())
    return self.replace(replacement_double.s(f"replacement/{n}", n, hold))


@shared_task(base=IdempotentTask, bind=True, idempotency_key="replace-fail/{n}")
def replaced_by_failure(self, n):
    Effect.objects.create(key=self.idempotency_key, attempt=self.attempt, pid=os.getpid())
    return self.replace(replacement_fails.s(f"replacement-fail/{n}"))


@shared_task(base=IdempotentTask, bind=True, atomic=True, idempotency_key="replace-atomic/{n}")
def replaced_atomic(self, n):
    Effect.objects.create(key=self.idempotency_key, attempt=self.attempt, pid=os.getpid())
    return self.replace(replacement_double.s(f"replacement-atomic/{n}", n))


@shared_task(base=IdempotentTask, bind=True, idempotency_key="item/{x}")
def item(self, x, y=0):
    """A map/starmap/chunks target: one effect per ``x``."""
    Effect.objects.create(key=self.idempotency_key, attempt=self.attempt, pid=os.getpid())
    return x + y


@shared_task(base=IdempotentTask, bind=True, idempotency_key="uncertain/{name}",
             on_stale_claim="uncertain")
def uncertain_send(self, name, folder):
    """Must not re-run blindly: records its effect, then blocks until ``folder/name``."""
    from pathlib import Path

    Effect.objects.create(key=self.idempotency_key, attempt=self.attempt, pid=os.getpid())
    flag = Path(folder) / name
    deadline = time.monotonic() + 120
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return name
