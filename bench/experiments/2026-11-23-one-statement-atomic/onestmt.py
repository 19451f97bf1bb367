"""Issue 11 item 4, a prototype (bench only, NOT the library): a one-statement atomic path.

Today's ``atomic=True`` (``celery_idem.runner.Run.atomic``) is BEGIN; claim (PENDING ->
RUNNING, attempt + 1: the row lock makes a concurrent duplicate wait); body; commit
(RUNNING -> SUCCEEDED, fenced on the attempt); COMMIT. This path drops the claim:

    BEGIN; body; one conditional statement PENDING -> SUCCEEDED; COMMIT

The statement (``COMMIT_SQL``) moves the row only while it is still PENDING and the
claim's guards hold (same fingerprint, no retry scheduled for later unless this is that
retry's message, not expired), sets what the claim and the commit would have set
(attempt + 1, worker, task id, started and finished, the result) and says whether it won.
A concurrent duplicate that ran the body too waits on the winner's row lock, matches
nothing, and gets the row as the winner left it (``FOR SHARE`` re-reads the newest
version): it raises inside the transaction, so its body's writes roll back, and replays
that outcome like any duplicate. docs/benchmarks.md ("Issue 11 item 4") weighs it.

Only PostgreSQL, and only messages the library's producer sent (the intent exists);
everything else takes today's atomic path. ``OneStatementTask`` is the task base; the
benchmark's ``bench.atomic1`` and the prototype's integration tests
(tests/integration/test_onestmt_prototype.py) use it, with ``-I bench.onestmt`` on the
worker's command line (bench/worker_app.py imports it).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery import shared_task
from celery.exceptions import Ignore, Reject, Retry
from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from celery_idem import IdempotentTask
from celery_idem.backends import ClaimOutcome, JobRow, prepared
from celery_idem.backends.values import ROW_COLUMNS, row_from_tuple
from celery_idem.by_name import refused_error
from celery_idem.conf import settings
from celery_idem.errors import PersistenceError
from celery_idem.job_transaction import atomic_alias, job_transaction
from celery_idem.models import Job
from celery_idem.retries import eta as retry_eta
from celery_idem.runner import Run, storable
from celery_idem.signals import announce
from celery_idem.states import State

_ROW = ", ".join(ROW_COLUMNS)
_JOB = Job._meta.db_table

#: The one statement after the body: PENDING -> SUCCEEDED if the claim's guards hold.
#: Lost: the row that stood in the way, FOR SHARE so that a statement which waited for a
#: concurrent winner's lock returns the winner's row, not its own snapshot's (PENDING).
COMMIT_SQL = f"""
WITH target AS (
    SELECT id FROM {_JOB} WHERE namespace = %(namespace)s AND key = %(key)s
), won AS (
    UPDATE {_JOB}
    SET state = 'SUCCEEDED', attempt = attempt + 1, worker = %(worker)s,
        task_id = %(task_id)s, lease_expires_at = NULL, not_before = NULL,
        started_at = %(started)s, finished_at = %(now)s, updated_at = %(now)s,
        result = %(result)s::jsonb
    WHERE id = (SELECT id FROM target) AND state || '' = 'PENDING'
      AND fingerprint = %(fingerprint)s
      AND (not_before IS NULL OR not_before <= %(now)s OR task_id = %(task_id)s)
      AND (expires_at IS NULL OR expires_at >= %(now)s)
    RETURNING {_ROW}
), seen AS (
    SELECT {_ROW} FROM {_JOB}
    WHERE id = (SELECT id FROM target) AND NOT EXISTS (SELECT 1 FROM won)
    FOR SHARE
)
SELECT true, {_ROW} FROM won
UNION ALL
SELECT false, {_ROW} FROM seen
""".strip()

_ROW_SQL = f"SELECT false, {_ROW} FROM {_JOB} WHERE namespace = %(namespace)s AND key = %(key)s"

#: SQLSTATEs a body can meet only because a duplicate runs the same body at the same
#: time (today the duplicate waits on the claim's row lock and cannot): unique
#: violation, serialization failure, deadlock, lock not available (NOWAIT, lock_timeout).
CONFLICTS = frozenset({"23505", "40001", "40P01", "55P03"})


class _Lost(Exception):
    """The conditional commit matched nothing: roll the body back, then replay ``row``."""

    def __init__(self, row: JobRow | None) -> None:
        super().__init__("a concurrent attempt settled the key first")
        self.row = row


def _fetch(using: str, sql: str, params: dict[str, Any]) -> tuple[bool, JobRow | None]:
    with prepared.cursor(connections[using]) as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if not rows:
        return False, None
    won, *values = rows[0]
    return bool(won), row_from_tuple(values)


def conflict(exc: BaseException) -> bool:
    """Whether the body's error is one a concurrent duplicate of the body can cause."""
    cause = exc.__cause__
    return isinstance(exc, DatabaseError) and getattr(cause, "sqlstate", None) in CONFLICTS


def run_one_statement(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                      body: Any) -> Any:
    """One message of ``task``: the body, then the one conditional statement."""
    refused = refused_error(task.request)
    if refused is not None:
        raise refused
    message = Run(task, args, kwargs, body)
    using = atomic_alias(task)
    if not message.published or connections[using].vendor != "postgresql":
        return message.atomic()  # no intent to settle (eager, foreign producer): today's
    intent, started = message.intent, timezone.now()
    try:
        with job_transaction(using) as commit:
            result = body(*args, **kwargs)
            storable(result)
            commit.started = True  # what fails from here is the database
            won, row = _fetch(using, COMMIT_SQL, {
                "namespace": intent.namespace, "key": intent.key,
                "fingerprint": intent.fingerprint, "worker": message.worker,
                "task_id": message.request.id, "started": started, "now": timezone.now(),
                "result": _json(result)})
            if not won or row is None:
                raise _Lost(row)
            # The same two transition announcements as today's claim and commit.
            for event, source, target in (("claimed", "PENDING", "RUNNING"),
                                          ("succeeded", "RUNNING", "SUCCEEDED")):
                announce(using, row.id, event, source, target, row.attempt,
                         message.worker, message.request.id)
            return result
    except _Lost as lost:
        return message.not_claimed(ClaimOutcome(False, lost.row))
    except Retry as exc:
        eta, sent = retry_eta(exc), getattr(message.request, "_idem_sent_message", None)
        message.record_rolled_back(lambda c: c.schedule_retry(eta, "retry", sent))
        raise
    except (Ignore, Reject):
        raise
    except PersistenceError as exc:
        return message.wait(exc)
    except Exception as exc:
        if conflict(exc):
            return _after_conflict(message, using, exc)
        return _failed(message, exc)


def _after_conflict(message: Run, using: str, exc: Exception) -> Any:
    """The body met a concurrent copy of itself: it lost, it did not fail. Replay the key's
    outcome if it has one, else wait and come back (never FAILED for a conflict)."""
    _, row = _fetch(using, _ROW_SQL, {"namespace": message.intent.namespace,
                                      "key": message.intent.key})
    if row is not None and row.state is not State.PENDING:
        return message.not_claimed(ClaimOutcome(False, row))
    return message.wait(exc)


def _failed(message: Run, exc: Exception) -> Any:
    """A body's own error: claim and record the failure as today; if another copy has
    settled the key meanwhile, that outcome stands and is replayed."""
    with transaction.atomic(using=settings.DATABASE):
        outcome, claim = message.acquire()
        if claim is not None:
            claim.fail(exc)
    if claim is None:
        return message.not_claimed(outcome)
    raise exc


def _json(value: Any) -> str:
    return json.dumps(value)


class OneStatementTask(IdempotentTask):
    """``atomic=True`` run by ``run_one_statement`` (a prototype: see the module)."""

    abstract = True
    atomic = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.called_directly:
            return super().__call__(*args, **kwargs)
        body = super(IdempotentTask, self).__call__
        return run_one_statement(self, args, kwargs, body)


# -- the prototype's tasks ---------------------------------------------------------------

def _effect(key: str, **value: Any) -> None:
    from django_app.effects.models import Effect

    Effect.objects.create(key=key, value=value or None, pid=os.getpid())


@shared_task(name="bench.atomic1", base=OneStatementTask, ignore_result=True,
             idempotency_key="bench/{key}")
def bench_atomic1(key):
    """The benchmark's ``atomic1``: ``bench.atomic``'s body on the one-statement path."""
    _effect(key)
    return key


def _hold(folder: str, name: str, wait_for: int = 1) -> None:
    """Write ``folder/name.<pid>.started``, then block until ``folder/name`` exists or
    ``wait_for`` bodies of ``name`` have started (a barrier for concurrent duplicates)."""
    Path(folder, f"{name}.{os.getpid()}.started").write_text(str(os.getpid()))
    flag, deadline = Path(folder) / name, time.monotonic() + 120
    while not flag.exists() and time.monotonic() < deadline:
        if wait_for > 1 and len(list(Path(folder).glob(f"{name}.*.started"))) >= wait_for:
            return
        time.sleep(0.05)


@shared_task(name="onestmt.wait_for_file", base=OneStatementTask, bind=True,
             idempotency_key="wait-atomic1/{name}")
def wait_for_file_atomic1(self, name, folder, wait_for=1):
    """Records its effect in the body's transaction, then holds (``_hold``); returns the
    pid of the body that ran, so a replay shows whose result it got."""
    _effect(self.idempotency_key, name=name)
    _hold(folder, name, wait_for)
    return {"name": name, "pid": os.getpid()}


@shared_task(name="onestmt.deduct_once", base=OneStatementTask, bind=True,
             idempotency_key="deduct1/{order_id}/{sku}")
def deduct_once_atomic1(self, order_id, sku, folder):
    """Both copies pass the barrier, then insert the same (order, sku) deduction: the
    second waits on the first's uncommitted unique entry and fails with a unique
    violation once the first commits (today's claim makes it wait before its body)."""
    from django_app.effects.models import StockDeduction

    _hold(folder, f"deduct-{order_id}-{sku}", wait_for=2)
    StockDeduction.objects.create(order_id=order_id, sku=sku, quantity=1)
    return {"deducted": 1, "pid": os.getpid()}


@shared_task(name="onestmt.lock_nowait", base=OneStatementTask, bind=True,
             idempotency_key="nowait1/{sku}")
def lock_nowait_atomic1(self, sku, folder):
    """Locks the product NOWAIT, takes one unit, holds: a copy that runs meanwhile fails
    to lock (55P03) before the first commits, which today cannot happen."""
    from django.db.models import F

    from django_app.effects.models import Stock

    stock = Stock.objects.select_for_update(nowait=True).get(sku=sku)
    Stock.objects.filter(pk=stock.pk).update(quantity=F("quantity") - 1)
    _hold(folder, f"nowait-{sku}")
    return {"quantity": stock.quantity - 1, "pid": os.getpid()}
