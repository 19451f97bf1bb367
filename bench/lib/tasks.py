"""Tasks the benchmarks (``bench/``) run: every variant writes exactly one Effect row.

Not autodiscovered (Celery only imports ``tasks`` modules): the benchmark worker app
``bench.lib.worker_app`` adds this module to ``imports``, and the benchmark scripts import it.
Results are not stored (``ignore_result``), so every variant pays the same for Celery's
own bookkeeping and the numbers isolate what the deduplication layer costs.

``celery-once`` is optional (the ``bench`` extra): without it ``bench_once`` is None.
"""

from __future__ import annotations

import json
import os

from celery import shared_task
from django.db import IntegrityError, connection

from bench.lib import floor_sql, layouts_sql
from celery_idem import IdempotentTask
from django_app.effects.models import Effect


def _write(key: str) -> None:
    Effect.objects.create(key=key, pid=os.getpid())


@shared_task(name="bench.plain", ignore_result=True)
def bench_plain(key):
    """Plain Celery: one row, no deduplication."""
    _write(key)
    return key


def _real(key: str) -> None:
    """What a task does more often than one INSERT: five queries around its one effect (a
    read by the key's index, the row, an update of it by primary key, a neighbour by the
    primary key's index, the row read back)."""
    Effect.objects.filter(key=key).exists()
    row = Effect.objects.create(key=key, pid=os.getpid())
    Effect.objects.filter(pk=row.pk).update(pid=row.pid)
    Effect.objects.filter(pk__lt=row.pk).order_by("-pk").values_list("pk", flat=True).first()
    Effect.objects.filter(pk=row.pk).values_list("key", "created_at").get()


@shared_task(name="bench.plain_real", ignore_result=True)
def bench_plain_real(key):
    """Plain Celery with a realistic body (``_real``): five queries, one effect."""
    _real(key)
    return key


@shared_task(name="bench.idem_real", base=IdempotentTask, ignore_result=True,
             idempotency_key="bench/{key}")
def bench_idem_real(key):
    """IdempotentTask, default mode, with the same realistic body."""
    _real(key)
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


@shared_task(name="bench.optimistic", base=IdempotentTask, ignore_result=True,
             atomic="optimistic", idempotency_key="bench/{key}")
def bench_optimistic(key):
    """IdempotentTask, atomic="optimistic": the body, then one insert of the finished row
    in its transaction (with broker durability: no row before it)."""
    _write(key)
    return key


def _floor_claim(cursor, key):
    """The floor's claim (bench/lib/floor_sql.py): its attempt, or None if the key is taken."""
    if connection.vendor == "postgresql":
        cursor.execute(floor_sql.CLAIM, (key,))
        row = cursor.fetchone()
    else:
        row = _mysql_claim(cursor, *floor_sql.CLAIM_MYSQL, (key,))
    return None if row is None else row[-1]


def _mysql_claim(cursor, insert, claim, read, params):
    """A claim on MySQL/MariaDB, which has no RETURNING: the INSERT of the claimed row
    (attempt 1), unless ``insert`` is None; on a duplicate key, the guarded UPDATE
    (rowcount 1: won) and the read of the row. The row (its last column the attempt), or
    None if the key is taken."""
    if insert is not None:
        try:
            cursor.execute(insert, params)
            return cursor.lastrowid, 1
        except IntegrityError:
            pass  # the key exists: claim it if PENDING
    cursor.execute(claim, params)
    if cursor.rowcount != 1:
        return None
    cursor.execute(read, params)
    return cursor.fetchone()


@shared_task(name="bench.floor_django", ignore_result=True)
def bench_floor_django(key):
    """The bare protocol inside the plain task: the floor's claim and fenced commit in raw
    SQL on Django's connection (autocommitted, as the default mode's), around the same
    ORM create. What any effect-once layer adds to a Django task at the least."""
    with connection.cursor() as cursor:
        attempt = _floor_claim(cursor, key)
        if attempt is None:
            return None  # finished, or running elsewhere
        _write(key)
        cursor.execute(floor_sql.COMMIT[connection.vendor], (json.dumps(key), key, attempt))
    return key


#: The layout floors' values of a claim (bench/lib/layouts_sql.py); the namespace is the
#: intent's (bench/suites/end_to_end_variants.py).
LAYOUT_NAMESPACE, LAYOUT_WORKER = "bench.floor_layout", "bench@floor/1"


@shared_task(name="bench.floor_layout", bind=True, ignore_result=True)
def bench_floor_layout(self, key, layout, upsert=False):
    """The library's statements on a candidate layout of the job row (bench/lib/layouts_sql.py),
    in raw SQL on Django's connection around the same ORM create: the layout's claim by key
    (the intent was written at publish; with ``upsert``, none was and the bare table's
    claim inserts the row) and its fenced commit. What the table costs, without the
    library's Python."""
    statements = layouts_sql.layouts(connection.vendor)[layout]
    params = {"namespace": LAYOUT_NAMESPACE, "key": key, "worker": LAYOUT_WORKER,
              "task_id": self.request.id}
    with connection.cursor() as cursor:
        claimed = _layout_claim(cursor, statements, params, upsert)
        if claimed is None:
            return None  # finished, or running elsewhere
        _write(key)
        cursor.execute(statements.commit, {"id": claimed[0], "attempt": claimed[1],
                                           "result": json.dumps(key)})
    return key


def _layout_claim(cursor, statements, params, upsert):
    """A layout floor's claim: (id, attempt), or None if the key is taken."""
    if connection.vendor == "postgresql":
        cursor.execute(layouts_sql.BARE_CLAIM_UPSERT if upsert else statements.claim_by_key,
                       params)
        return cursor.fetchone()
    return _mysql_claim(cursor, layouts_sql.MYSQL_BARE_CLAIM_INSERT if upsert else None,
                        statements.claim_by_key, statements.claim_read, params)


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
