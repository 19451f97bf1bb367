"""A Celery app without Django, for the end-to-end suite: ``celery -A bench.lib.raw_app worker``.

Two tasks on one psycopg connection per pool child, opened on first use and kept:

- ``bench.raw``: plain Celery writing one row with the raw driver (the baseline the issue
  measured: no ORM, no per-task reconnect);
- ``bench.floor``: the bare protocol in raw SQL: claim the key (one upsert that wins only
  from PENDING or no row), write the row, commit the claim fenced by its attempt: the
  floor any "effect once per key" layer on PostgreSQL pays in the worker.

The worker settings are the README's recommendation (acks_late, reject on worker lost,
prefetch 1), as the Django project has them; the finish marks are bench.lib.worker_app's.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery, signals

from bench.lib import floor_sql

app = Celery("bench_raw", broker=os.environ.get("IDEM_BROKER"), set_as_current=False)
app.conf.update(
    task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
    task_serializer="json", accept_content=["json"], task_ignore_result=True,
    task_default_queue=os.environ.get("IDEM_QUEUE", "celery"), worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)

_conn: list[Any] = []  # [pid, connection]


def conn() -> Any:
    """This process's connection (a forked child never uses its parent's)."""
    if not _conn or _conn[0] != os.getpid():
        import psycopg

        _conn[:] = [os.getpid(), psycopg.connect(
            dbname=os.environ.get("IDEM_PG_NAME", "idem_bench"),
            host=os.environ.get("IDEM_PG_HOST", "127.0.0.1"),
            port=int(os.environ.get("IDEM_PG_PORT", "5432")),
            user=os.environ.get("IDEM_PG_USER", "postgres"), autocommit=True,
            # Behind a transaction pooler (--database pgbouncer) nothing is prepared: the
            # next statement may run on another server session.
            **({"prepare_threshold": None} if os.environ.get("IDEM_PGBOUNCER") == "1"
               else {}))]
    return _conn[1]


def _effect(key: str) -> None:
    conn().execute("INSERT INTO effects_effect (key, pid, created_at) VALUES (%s, %s, now())",
                   (key, os.getpid()))


@app.task(name="bench.raw")
def raw(key: str) -> str:
    _effect(key)
    return key


@app.task(name="bench.floor")
def floor(key: str) -> str | None:
    c = conn()
    row = c.execute(floor_sql.CLAIM, (key,)).fetchone()
    if row is None:
        return None  # finished or running elsewhere: nothing to do
    _effect(key)
    c.execute(floor_sql.COMMIT["postgresql"], (json.dumps(key), key, row[0]))
    return key


_marker: list[Any] = []


@signals.task_postrun.connect(weak=False)
def _mark(**_: object) -> None:
    """The same finish stamp as bench.lib.worker_app._mark (one pipelined Redis call)."""
    if not os.environ.get("BENCH_MARK_URL"):
        return
    if not _marker:
        import redis

        _marker.append(redis.Redis.from_url(os.environ["BENCH_MARK_URL"]))
    prefix = f"benchmark:{os.environ['IDEM_QUEUE']}"
    now = repr(time.time())
    pipe = _marker[0].pipeline(transaction=False)
    pipe.incr(f"{prefix}:n")
    pipe.setnx(f"{prefix}:first", now)
    pipe.set(f"{prefix}:last", now)
    pipe.execute()
