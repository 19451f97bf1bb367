"""Tasks the benchmarks (``bench/``) run: every variant writes exactly one Effect row.

Not autodiscovered (Celery only imports ``tasks`` modules): the benchmark worker app
``bench.worker_app`` adds this module to ``imports``, and the benchmark scripts import it.
Results are not stored (``ignore_result``), so every variant pays the same for Celery's
own bookkeeping and the numbers isolate what the deduplication layer costs.

``celery-once`` is optional (the ``bench`` extra): without it ``bench_once`` is None.
"""

from __future__ import annotations

import os

from celery import shared_task

from celery_idem import IdempotentTask

from .models import Effect


def _write(key: str) -> None:
    Effect.objects.create(key=key, pid=os.getpid())


@shared_task(name="bench.plain", ignore_result=True)
def bench_plain(key):
    """Plain Celery: one row, no deduplication."""
    _write(key)
    return key


@shared_task(name="bench.idem", base=IdempotentTask, ignore_result=True,
             idempotency_key="bench/{key}")
def bench_idem(key):
    """IdempotentTask, default mode: claim, body, commit as separate statements."""
    _write(key)
    return key


@shared_task(name="bench.atomic", base=IdempotentTask, ignore_result=True, atomic=True,
             idempotency_key="bench/{key}")
def bench_atomic(key):
    """IdempotentTask, atomic=True: claim, body and commit in one transaction."""
    _write(key)
    return key


@shared_task(name="bench.retry", base=IdempotentTask, bind=True, ignore_result=True,
             idempotency_key="bench-retry/{key}", max_retries=3, default_retry_delay=0)
def bench_retry(self, key, failures=1):
    """Writes its row, then asks for a retry ``failures`` times (the retry path)."""
    _write(key)
    if self.request.retries < failures:
        raise self.retry(countdown=0)
    return key


@shared_task(name="bench.noop", ignore_result=True)
def bench_noop(key):
    """No database access at all (what the per-task reconnect costs is measured apart)."""
    return key


try:
    from celery_once import QueueOnce
except ImportError:  # pragma: no cover - the bench extra is not installed
    QueueOnce = None

if QueueOnce is not None:
    @shared_task(name="bench.once", base=QueueOnce, ignore_result=True,
                 once={"keys": ["key"], "graceful": False})
    def bench_once(key):
        """celery-once: a Redis lock per key taken at publish, released after the run."""
        _write(key)
        return key
else:  # pragma: no cover
    bench_once = None
