"""Part 1 of bench/protocol_cost.py: each path of the protocol run once, with the
statements and round trips it sends (protocol_counter.py). Apart from the timed loops of
part 2 (protocol_loops.py), which share nothing with it but the tracer.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from bench.protocol_counter import count
from bench.protocol_tracer import QUEUE, patched, run_task


def paths() -> dict[str, Any]:
    from django.db import connection

    from django_app.effects import bench_tasks as t

    out: dict[str, Any] = {}
    tag = uuid.uuid4().hex[:6]

    def key_of(name: str) -> str:
        return f"{tag}-{name}"

    # plain task, for reference: one INSERT
    with count() as n:
        run_task(t.bench_plain, (key_of("plain"),))
    out["plain task (reference)"] = n.as_dict()

    # producer: the PENDING intent (outside a transaction on the bookkeeping connection,
    # whose first use of a statement prepares it: warm it first, as a producer's is)
    t.bench_idem.apply_async((key_of("warm"),), queue=QUEUE)
    with count() as n:
        t.bench_idem.apply_async((key_of("fresh"),), queue=QUEUE)
    out["publish (producer intent)"] = n.as_dict()

    ikey = "bench/" + key_of("fresh")
    with count() as n:
        run_task(t.bench_idem, (key_of("fresh"),), key=ikey)
    out["fresh run (default)"] = _beyond_body(n.as_dict())

    with count() as n:
        run_task(t.bench_idem, (key_of("fresh"),), key=ikey)
    out["replay of a finished key (default)"] = _beyond_body(n.as_dict(), body=0)

    t.bench_atomic.apply_async((key_of("atomic"),), queue=QUEUE)
    akey = "bench/" + key_of("atomic")
    with count() as n:
        run_task(t.bench_atomic, (key_of("atomic"),), key=akey)
    out["fresh run (atomic)"] = _beyond_body(n.as_dict())
    with count() as n:
        run_task(t.bench_atomic, (key_of("atomic"),), key=akey)
    out["replay of a finished key (atomic)"] = _beyond_body(n.as_dict(), body=0)

    # in-progress duplicate: another attempt holds a live claim
    t.bench_idem.apply_async((key_of("busy"),), queue=QUEUE)
    bkey = "bench/" + key_of("busy")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE celery_idem_job SET state = 'RUNNING', attempt = 1, worker = 'other/1',"
            " task_id = 'other', lease_expires_at = now() + interval '1 hour'"
            " WHERE namespace = %s AND key = %s", [t.bench_idem.name, bkey])
    with count() as n:
        run_task(t.bench_idem, (key_of("busy"),), key=bkey)
    out["in-progress duplicate (on_in_progress=retry)"] = _beyond_body(n.as_dict(), body=0)

    # retry: attempt 1 asks for a retry, attempt 2 succeeds (same task id, as Celery does)
    t.bench_retry.apply_async((key_of("retry"),), queue=QUEUE)
    rkey = "bench-retry/" + key_of("retry")
    tid = str(uuid.uuid4())
    with count() as n:
        run_task(t.bench_retry, (key_of("retry"),), key=rkey, task_id=tid)
    out["retry: attempt 1 (self.retry)"] = _beyond_body(n.as_dict())
    with count() as n:
        run_task(t.bench_retry, (key_of("retry"),), key=rkey, task_id=tid, retries=1)
    out["retry: attempt 2 (succeeds)"] = _beyond_body(n.as_dict())

    # the same default-mode paths with the proposed fixes (bench/worker_app.py PATCHES)
    def fixed_paths() -> None:
        t.bench_idem.apply_async((key_of("fixed"),), queue=QUEUE)
        fkey = "bench/" + key_of("fixed")
        for _ in range(6):  # warm: the connection opens and prepares its statements
            t.bench_idem.apply_async((key_of("warm") + str(_),), queue=QUEUE)
            run_task(t.bench_idem, (key_of("warm") + str(_),), key="bench/" + key_of("warm") + str(_))
        with count() as n:
            run_task(t.bench_idem, (key_of("fixed"),), key=fkey)
        out["fresh run (default), proposed fixes"] = _beyond_body(n.as_dict())
        with count() as n:
            run_task(t.bench_idem, (key_of("fixed"),), key=fkey)
        out["replay of a finished key (default), proposed fixes"] = _beyond_body(
            n.as_dict(), body=0)
        return 0.0

    patched(fixed_paths)
    out.update(reaper_paths(tag))
    return out


def _beyond_body(d: dict[str, Any], body: int = 1) -> dict[str, Any]:
    """The body writes one row (one statement, one round trip) in these tasks."""
    d["body_statements"] = body
    d["protocol_statements"] = d["statements"] - body
    d["protocol_round_trips"] = d["round_trips"] - body
    return d


def reaper_paths(tag: str) -> dict[str, Any]:
    try:
        from celery_idem.recovery import reap
    except ImportError as exc:
        return {"recovery pass": {"pending": f"celery_idem.recovery not importable: {exc}"}}
    from django.db import connection

    from django_app.effects import bench_tasks as t

    out: dict[str, Any] = {}
    now = datetime.now(UTC)
    with count() as n:
        reap(now=now)
    out["recovery pass, nothing to do"] = n.as_dict()
    for i in range(10):
        t.bench_idem.apply_async((f"{tag}-stale-{i}",), queue=QUEUE)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE celery_idem_job SET state = 'RUNNING', attempt = 1, worker = 'dead/1',"
            " lease_expires_at = now() - interval '1 minute', updated_at = now()"
            " WHERE key LIKE %s", [f"bench/{tag}-stale-%"])
    with count() as n:
        report = reap(now=datetime.now(UTC))
    d = n.as_dict()
    d["report"] = str(report)
    d["per_stale_claim_statements"] = round((d["statements"] - out[
        "recovery pass, nothing to do"]["statements"]) / 10, 2)
    out["recovery pass, 10 stale claims"] = d
    return out
