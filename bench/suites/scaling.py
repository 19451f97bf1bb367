"""Scaling: claim+commit latency, a recovery pass and the admin at 10k, 100k and 1M jobs.

    python -m bench run scaling --n 1000000        # 10k, 100k and 1M jobs

The job table grows in place (10k, then +90k, then +900k rows), bulk-loaded with
``generate_series`` (3 history lines per job, as a finished job has: published, claimed,
succeeded), then ``VACUUM ANALYZE``. At each size:

- ``claim+commit``: ``--ops`` fresh keys published through the producer, then claimed
  and committed through ``claims.acquire`` + ``Claim.succeed``; median of batches, in
  microseconds per key. Also the replay of an old, finished key (``claims.acquire`` on
  random bulk-loaded keys). ``EXPLAIN (ANALYZE, BUFFERS)`` of the claim statement shows
  which index it uses.
- ``recovery pass``: ``--stale`` bulk-loaded jobs turned into stale claims (RUNNING,
  lease expired), then one ``celery_idem.recovery.reap()`` pass, timed (it releases them and
  sends them again to a throwaway Redis queue, deleted afterwards); plus an idle pass
  with nothing to do, and the plans of the pass's queries.
- ``admin``: the job changelist (``/admin/celery_idem/job/``) rendered by Django's test
  client as a superuser: time and query count, unfiltered and filtered by state.

Below: the run, the table, then the measurements of a size (claims, the recovery pass,
the admin; plans read with bench/lib/measure.py's ``explain``).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import uuid
from typing import Any

from bench.lib import common as c
from bench.lib.environment import environment
from bench.lib.measure import explain
from bench.suites import Options, refuse

QUESTION = ("Do claims, a recovery pass and the admin stay fast as the job table grows "
            "(N/100, N/10 and N jobs)?")
STACKS = ("postgres",)
#: What ``--quick`` runs: two small tables, a few operations.
QUICK = ["--sizes", "1000,2000", "--ops", "20", "--batches", "1", "--stale", "20"]


def arguments(o: Options) -> list[str]:
    for option, value in (("--variants", o.variants), ("--broker", o.broker)):
        refuse("scaling", option, value)
    if o.n is not None:
        sizes = ",".join(str(max(1, o.n // d)) for d in (100, 10, 1))
        return ["--sizes", sizes, *o.pick(o.rounds, 1, "--batches")]
    return [*(QUICK if o.quick else []), *(["--batches", str(o.rounds)] if o.rounds else [])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--ops", type=int, default=1000, help="claim+commit ops per size")
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--stale", type=int, default=1000)
    ap.add_argument("--backlog", type=int, default=100000,
                    help="at the largest size, also measure with this many PENDING jobs")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    queue = c.new_queue("bench-scaling")
    c.configure("redis", queue=queue)
    c.setup_django()
    import bench.lib.worker_app  # noqa: F401

    env = environment()
    c.reset_tables()
    results = []
    tag = uuid.uuid4().hex[:6]
    loaded = 0
    try:
        for size in sizes:
            load_s = bulk_load(loaded, size, tag)
            loaded = size
            rng = random.Random(size)
            sample = [f"bench/{tag}-{g}" for g in rng.sample(range(size), min(size, max(
                args.stale, args.ops)))]
            c.log(f"size {size}: loaded in {load_s:.1f}s; table has {table_rows()} rows")
            r: dict[str, Any] = {"size": size, "rows": table_rows(), "load_s": round(load_s, 1)}
            r["claim"] = claim_latency(args.ops, args.batches, sample)
            r["claim_explain"] = explain_claim()
            r["recovery"] = recovery(args.stale, sample)
            r["admin"] = admin_changelist()
            r["loadavg"] = c.loadavg()
            results.append(r)
            c.log(f"size {size}: claim+commit {r['claim']['fresh_claim_commit_us']}us,"
                  f" replay {r['claim']['replay_claim_us']}us,"
                  f" claim uses {r['claim_explain']['indexes']},"
                  f" recovery {r['recovery'].get('stale_pass_ms')}ms"
                  f" ({r['recovery'].get('stale')} stale), idle {r['recovery'].get('idle_pass_ms')}ms,"
                  f" admin {({k: (v['ms'], v['queries']) for k, v in r['admin'].items() if isinstance(v, dict)})}")
        backlog: dict[str, Any] | None = None
        if args.backlog:
            pending = make_backlog(args.backlog, tag, loaded)
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("SELECT key FROM celery_idem_job WHERE state = 'SUCCEEDED'"
                               " AND key LIKE 'bench/' || %s || '-%%' ORDER BY random()"
                               " LIMIT %s", [tag, args.ops])
                sample = [k for (k,) in cursor.fetchall()]
            backlog = {"pending_jobs": pending, "rows": table_rows(),
                       "claim": claim_latency(args.ops, args.batches, sample),
                       "claim_explain": explain_claim()}
            c.log(f"backlog of {pending} PENDING jobs: claim+commit"
                  f" {backlog['claim']['fresh_claim_commit_us']}us, claim uses"
                  f" {backlog['claim_explain']['indexes']}"
                  f" ({backlog['claim_explain']['execution_ms']} ms execution)")
    finally:
        c.delete_queue("redis", queue)
    base = results[0]["claim"]["fresh_claim_commit_us"]
    data = {"benchmark": "scaling", "command": c.command_line(), "environment": env,
            "settings": vars(args), "results": results, "backlog": backlog,
            "claim_ratio_largest_to_smallest": round(
                results[-1]["claim"]["fresh_claim_commit_us"] / base, 3),
            "loadavg_end": c.loadavg()}
    c.write_result("scaling", data, args.out)
    print(f"\n{'rows':>9} {'claim+commit us':>16} {'replay us':>10} {'recovery ms':>12}"
          f" {'idle ms':>8} {'admin ms':>9} {'admin q':>8}")
    for r in results:
        adm = r["admin"].get("unfiltered", {}) if isinstance(r["admin"], dict) else {}
        print(f"{r['rows']:>9} {r['claim']['fresh_claim_commit_us']:>16}"
              f" {r['claim']['replay_claim_us']:>10} {r['recovery'].get('stale_pass_ms', '-')!s:>12}"
              f" {r['recovery'].get('idle_pass_ms', '-')!s:>8} {adm.get('ms', '-')!s:>9}"
              f" {adm.get('queries', '-')!s:>8}")
    print(f"claim+commit at {results[-1]['rows']} / at {results[0]['rows']}:"
          f" {data['claim_ratio_largest_to_smallest']}")
    return 0



TASK = "bench.idem"


def table_rows() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM celery_idem_job")
        return int(cursor.fetchone()[0])


def bulk_load(start: int, stop: int, tag: str) -> float:
    """Insert finished jobs ``start``..``stop``-1 with their history; returns seconds."""
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(max(id), 0) FROM celery_idem_job")
        max_id = cursor.fetchone()[0]
        cursor.execute(
            "INSERT INTO celery_idem_job (namespace, key, task_name, args, kwargs, fingerprint,"
            " options, state, attempt, worker, task_id, lease_expires_at, not_before,"
            " dispatch_count, result, error, created_at, started_at, finished_at, updated_at)"
            " SELECT %(task)s, 'bench/' || %(tag)s || '-' || g, %(task)s,"
            " jsonb_build_array(%(tag)s || '-' || g), '{}'::jsonb, md5(g::text) || md5(g::text),"
            " '{}'::jsonb, 'SUCCEEDED', 1, 'bulk/1', md5('t' || g), NULL, NULL, 0,"
            " to_jsonb(%(tag)s || '-' || g), NULL, t, t, t + interval '1 second',"
            " t + interval '1 second'"
            " FROM generate_series(%(start)s, %(stop)s - 1) g,"
            " LATERAL (SELECT now() - interval '30 days' * ((g::bigint * 7919) %% 1000) / 1000.0 AS t) ts",
            {"task": TASK, "tag": tag, "start": start, "stop": stop})
        cursor.execute(
            "INSERT INTO celery_idem_transition (job_id, event, from_state, to_state, attempt,"
            " worker, task_id, reason, actor, at)"
            " SELECT j.id, e.event, e.from_state, e.to_state, e.attempt, 'bulk/1', j.task_id,"
            " '', '', j.created_at"
            " FROM celery_idem_job j CROSS JOIN (VALUES ('published', NULL, 'PENDING', 0),"
            " ('claimed', 'PENDING', 'RUNNING', 1), ('succeeded', 'RUNNING', 'SUCCEEDED', 1))"
            " AS e(event, from_state, to_state, attempt)"
            " WHERE j.id > %(max_id)s AND j.key LIKE 'bench/' || %(tag)s || '-%%'",
            {"tag": tag, "max_id": max_id})
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE celery_idem_job")
        cursor.execute("VACUUM ANALYZE celery_idem_transition")
        # Flush the load's dirty pages now, so its checkpoint does not land in the timings.
        cursor.execute("CHECKPOINT")
    return time.perf_counter() - started


def make_backlog(count: int, tag: str, size: int) -> int:
    """Turn ``count`` finished jobs back into PENDING ones: a queue with a backlog."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE celery_idem_job SET state = 'PENDING', attempt = 0, result = NULL,"
            " finished_at = NULL, started_at = NULL, updated_at = now()"
            " WHERE key LIKE 'bench/' || %s || '-%%' AND id %% %s = 0",
            [tag, max(1, size // count)])
        changed = cursor.rowcount
        cursor.execute("VACUUM ANALYZE celery_idem_job")
        cursor.execute("CHECKPOINT")
    return changed


def _fix_fingerprints(keys: list[str]) -> list[Any]:
    """Give sampled bulk rows the fingerprint their task computes; returns their intents."""
    from django.db import connection

    from bench.lib import tasks as t

    intents = [t.bench_idem.intent((k.removeprefix("bench/"),)) for k in keys]
    with connection.cursor() as cursor:
        cursor.executemany(
            "UPDATE celery_idem_job SET fingerprint = %s WHERE namespace = %s AND key = %s",
            [(i.fingerprint, i.namespace, i.key) for i in intents])
    return intents


def claim_latency(ops: int, batches: int, sample_keys: list[str]) -> dict[str, Any]:
    from bench.lib import tasks as t
    from celery_idem import claims

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

    from bench.lib import tasks as t
    from celery_idem import claims
    from celery_idem.backends import routines

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


def recovery(stale: int, sample_keys: list[str]) -> dict[str, Any]:
    try:
        from celery_idem.recovery import reap
    except ImportError as exc:
        return {"pending": f"celery_idem.recovery not importable: {exc}"}
    from datetime import UTC, datetime

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    out: dict[str, Any] = {}
    # idle pass first: nothing stale
    with CaptureQueriesContext(connection) as q:
        started = time.perf_counter()
        report = reap(now=datetime.now(UTC))
        out["idle_pass_ms"] = round(1e3 * (time.perf_counter() - started), 1)
    out["idle_pass_queries"] = len(q.captured_queries)
    out["idle_report"] = str(report)
    selects = [x["sql"] for x in q.captured_queries if x["sql"].lstrip().upper().startswith("SELECT")]
    out["plans"] = []
    for sql in selects:
        try:
            out["plans"].append({"sql": sql[:300], **explain(sql, None)})
        except Exception as exc:  # noqa: BLE001
            out["plans"].append({"sql": sql[:300], "error": str(exc)})
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE celery_idem_job SET state = 'RUNNING', attempt = 1, worker = 'dead/1',"
            " lease_expires_at = now() - interval '1 minute', result = NULL, finished_at = NULL,"
            " updated_at = now() WHERE key = ANY(%s)", [sample_keys[:stale]])
        marked = cursor.rowcount
    from celery_idem.recovery import sweep as reaper

    sending = []
    send = reaper.redispatch

    def timed_send(*args: Any, **kwargs: Any) -> str:
        started = time.perf_counter()
        try:
            return send(*args, **kwargs)
        finally:
            sending.append(time.perf_counter() - started)

    reaper.redispatch = timed_send
    try:
        with CaptureQueriesContext(connection) as q:
            started = time.perf_counter()
            report = reap(now=datetime.now(UTC))
            out["stale_pass_ms"] = round(1e3 * (time.perf_counter() - started), 1)
    finally:
        reaper.redispatch = send
    # Publishing the messages again is Celery's and kombu's work, not the database's.
    out["stale_pass_sending_ms"] = round(1e3 * sum(sending), 1)
    out["stale"] = marked
    out["stale_pass_queries"] = len(q.captured_queries)
    out["stale_report"] = str(report)
    # put them back to finished, so later sizes and the admin see the same shape
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE celery_idem_job SET state = 'SUCCEEDED', lease_expires_at = NULL,"
            " finished_at = now(), result = to_jsonb(key) WHERE key = ANY(%s)",
            [sample_keys[:stale]])
    return out


def admin_changelist() -> dict[str, Any]:
    try:
        from django.contrib.auth import get_user_model
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext, setup_test_environment
    except ImportError as exc:
        return {"pending": str(exc)}
    try:
        from django.contrib import admin

        from celery_idem.models import Job

        if Job not in admin.site._registry:
            return {"pending": "celery_idem's Job is not registered in the admin"}
    except Exception as exc:  # noqa: BLE001
        return {"pending": f"admin not importable: {exc}"}
    try:
        setup_test_environment()
    except RuntimeError:
        pass  # already set up
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    out: dict[str, Any] = {}
    for label, url in (("unfiltered", "/admin/celery_idem/job/"),
                       ("state=RUNNING", "/admin/celery_idem/job/?state__exact=RUNNING"),
                       ("search key prefix", "/admin/celery_idem/job/?q=bench%2F"),
                       ("page 100", "/admin/celery_idem/job/?p=100")):
        timings = []
        queries = 0
        status = None
        for _ in range(3):
            with CaptureQueriesContext(connection) as q:
                started = time.perf_counter()
                response = client.get(url)
                timings.append(1e3 * (time.perf_counter() - started))
            status = response.status_code
            queries = len(q.captured_queries)
            slowest = sorted(q.captured_queries, key=lambda x: -float(x["time"]))[:3]
        out[label] = {"status": status, "ms": round(statistics.median(timings), 1),
                      "queries": queries,
                      "slowest_queries": [{"ms": round(1e3 * float(x["time"]), 2),
                                           "sql": x["sql"][:240]} for x in slowest]}
    return out
