"""bench/scaling.py's claim measurements at one table size: claim+commit of fresh keys,
the replay of finished ones, and the plan of the claim statement. Apart from the table
they run on (scaling_table.py) and from the other measurements of a size.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

from bench.query_plan import explain


def _fix_fingerprints(keys: list[str]) -> list[Any]:
    """Give sampled bulk rows the fingerprint their task computes; returns their intents."""
    from django.db import connection

    from django_app.effects import bench_tasks as t

    intents = [t.bench_idem.intent((k.removeprefix("bench/"),)) for k in keys]
    with connection.cursor() as cursor:
        cursor.executemany(
            "UPDATE celery_idem_job SET fingerprint = %s WHERE namespace = %s AND key = %s",
            [(i.fingerprint, i.namespace, i.key) for i in intents])
    return intents


def claim_latency(ops: int, batches: int, sample_keys: list[str]) -> dict[str, Any]:
    from celery_idem import claims
    from django_app.effects import bench_tasks as t

    fresh: list[float] = []
    replay: list[float] = []
    per = max(1, ops // batches)
    replay_intents = _fix_fingerprints(sample_keys)
    for b in range(batches):
        tag = uuid.uuid4().hex[:8]
        intents = []
        for i in range(per):
            key = f"{tag}-{i}"
            t.bench_idem.apply_async((key,), queue=os.environ["IDEM_QUEUE"])
            intents.append(t.bench_idem.intent((key,)))
        started = time.perf_counter()
        for intent in intents:
            _, claim = claims.acquire(intent, worker="bench/1", task_id=str(uuid.uuid4()),
                                      lease_seconds=3600, using="default")
            assert claim is not None and claim.succeed(intent.key)
        fresh.append(1e6 * (time.perf_counter() - started) / per)
        # Finished keys to replay: the sampled bulk rows, else this batch's own (tiny sizes).
        pool = replay_intents or intents
        chunk = pool[b * per % len(pool):][:per] or pool[:per]
        started = time.perf_counter()
        for intent in chunk:
            outcome, claim = claims.acquire(intent, worker="bench/1",
                                            task_id=str(uuid.uuid4()), lease_seconds=3600,
                                            using="default")
            assert claim is None and outcome.row is not None, outcome
        replay.append(1e6 * (time.perf_counter() - started) / len(chunk))
    return {"fresh_claim_commit_us": round(statistics.median(fresh), 1),
            "fresh_batches_us": [round(x, 1) for x in fresh],
            "replay_claim_us": round(statistics.median(replay), 1),
            "replay_batches_us": [round(x, 1) for x in replay]}


def explain_claim() -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the plugin's claim statement on a fresh key."""
    from django.db import connection

    from celery_idem import claims
    from celery_idem.backends import routines
    from django_app.effects import bench_tasks as t

    key = f"explain-{uuid.uuid4().hex[:8]}"
    t.bench_idem.apply_async((key,), queue=os.environ["IDEM_QUEUE"])
    intent = t.bench_idem.intent((key,))
    seen: list[tuple[str, Any]] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        claims.acquire(intent, worker="bench/1", task_id="explain", lease_seconds=3600,
                       using="default")
    sql, params = seen[0]
    # A stored routine's body (backends/routines.py): EXPLAIN sees into a statement, not
    # into a function call.
    sql = routines.statement_of(sql)
    # the key is claimed now; EXPLAIN ANALYZE a claim of another fresh key, rolled back
    key2 = f"explain-{uuid.uuid4().hex[:8]}"
    t.bench_idem.apply_async((key2,), queue=os.environ["IDEM_QUEUE"])
    intent2 = t.bench_idem.intent((key2,))
    params = dict(params)
    params.update(key=intent2.key, fingerprint=intent2.fingerprint)
    if "args" in params:
        import json

        params["args"] = json.dumps(intent2.args)
    return explain(sql, params)
