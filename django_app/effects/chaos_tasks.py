"""The chaos suite's tasks (tests/chaos): one per effect kind, each holding its claim for
a while (the body's "work") so that faults meet running attempts.

Each body marks itself running in ``folder/running/<pid>`` (key, attempt, kind) while it
runs, so the fault injector can pick a busy pool child to kill or freeze.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from celery import shared_task

from celery_idem import IdempotentTask

from ..fakes.client import create_charge
from .models import ChaosWrite

#: The non-idempotent effect: one line appended per execution of a counter body.
COUNTER_FILE = "counter.log"


@contextmanager
def _running(task, folder: str, kind: str) -> Iterator[None]:
    marker = Path(folder, "running", str(os.getpid()))
    marker.write_text(json.dumps({"key": task.idempotency_key, "attempt": task.attempt,
                                  "kind": kind}))
    try:
        yield
    finally:
        marker.unlink(missing_ok=True)


def _done(task) -> dict:
    return {"attempt": task.attempt, "pid": os.getpid()}


@shared_task(base=IdempotentTask, bind=True, atomic=True, idempotency_key="chaos/atomic/{n}")
def chaos_atomic(self, n, folder, hold):
    """Atomic: one ChaosWrite row, committed with the job or rolled back with it. No retry
    of its own on a lost connection: the library hands such an attempt back (nothing of
    it committed) and it runs again."""
    with _running(self, folder, "atomic"):
        ChaosWrite.objects.create(key=self.idempotency_key, attempt=self.attempt,
                                  pid=os.getpid())
        time.sleep(hold)  # the body's work: a fault may hit it here
    return _done(self)


@shared_task(base=IdempotentTask, bind=True, idempotency_key="chaos/charge/{n}",
             autoretry_for=(OSError,), max_retries=5, retry_backoff=1, retry_backoff_max=5)
def chaos_charge(self, n, folder, hold, provider_url):
    """Keyed: a charge at the fake provider under ``self.external_key("charge")``, the
    same on every attempt, so a re-run gets the stored charge back."""
    with _running(self, folder, "charge"):
        charge = create_charge(provider_url, amount=100 + n, currency="eur",
                               reference=self.idempotency_key,
                               idempotency_key=self.external_key("charge"))
        time.sleep(hold)
    return {**_done(self), "charge": charge["id"]}


@shared_task(base=IdempotentTask, bind=True, idempotency_key="chaos/count/{n}")
def chaos_count(self, n, folder, hold):
    """Non-idempotent: a line appended to ``folder/counter.log`` per execution, never
    rolled back (each repeat must be explained by a fault that hit an attempt)."""
    with _running(self, folder, "count"):
        line = json.dumps({"key": self.idempotency_key, "attempt": self.attempt,
                           "pid": os.getpid(), "t": time.time()}) + "\n"
        # One O_APPEND write of a short line: concurrent writers never interleave.
        fd = os.open(Path(folder, COUNTER_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        time.sleep(hold)
    return _done(self)
