"""Operating at scale: each operator action timed on a realistic job table of N rows.

    python -m bench run scale                     # 10M jobs (~11 GB, ~5 min to build)
    python -m bench run scale --n 20000           # a quick look (--n: the rows)
    python -m bench run scale -- --reuse          # time again on the table already built

The table lives in a database of its own (``IDEM_PG_NAME``, default ``idem_bench_scale``,
never the shared ``idem``), built with ``INSERT ... SELECT generate_series`` (secondary
indexes and constraints dropped for the load and built again after, then ``VACUUM
ANALYZE``): 2 history rows per job; 98 % SUCCEEDED, 1 % FAILED (a tenth of them
dead-lettered), 0.5 % RUNNING with expired leases, 0.5 % PENDING past the dispatch
timeout; 20 task names with a key prefix each (``order/``, ``invoice/``, ...), created
over 30 days in id order; a stored message (a real one, published through the
producer); plus ``--unknown`` (5,000) stale claims of a task no process knows.

Then each action, median of ``--repeat`` (3), through the library's own entry points:
the recovery pass (the first, which releases and re-sends the backlog to kombu's
in-memory broker, once, its clock moved back so the jobs it re-sends are between
re-sends afterwards: ``first_pass_lag``; then with only the unknown task's claims left;
then with nothing to do), ``idem_status`` (default and ``--exact``), every admin page
through Django's test client as a superuser (the list, each filter, the date ranges, the
sort orders, the searches, a page far down, a detail page), and ``idem_purge`` of the oldest day (rows/s) while a concurrent inserter
measures its worst insert latency. ``--drop`` drops the
database afterwards (the JSON stays).

Below: the run, then the table (its tasks, build and sizes), then the actions timed on
it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from datetime import timedelta
from io import StringIO
from typing import Any
from urllib.parse import urlencode

from bench.lib import common as c
from bench.lib.environment import environment
from bench.suites import Options, refuse

QUESTION = ("How long does each operator action (recovery, idem_status, the admin, "
            "idem_purge) take on a realistic table of N jobs (10 million by default)?")
STACKS = ("postgres",)


def arguments(o: Options) -> list[str]:
    for option, value in (("--variants", o.variants), ("--broker", o.broker)):
        refuse("scale", option, value)
    return [*o.pick(o.n, 4000, "--rows"), *(["--unknown", "20"] if o.quick else []),
            *o.pick(o.rounds, 1, "--repeat")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="jobs (default 10M)")
    ap.add_argument("--unknown", type=int, default=5000,
                    help="stale claims of a task no process knows (default 5,000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per action (median)")
    ap.add_argument("--purge-days", type=float, default=29.0,
                    help="idem_purge --older-than (default 29: the oldest day of 30)")
    ap.add_argument("--reuse", action="store_true",
                    help="time on the table already built (migrating it first)")
    ap.add_argument("--build-only", action="store_true", help="build, then stop")
    ap.add_argument("--drop", action="store_true", help="drop the database afterwards")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("IDEM_PG_NAME", "idem_bench_scale")
    c.configure_in_process(c.new_queue("bench-scale"))
    c.setup_django()
    register_tasks()
    try:
        built = table_sizes() if args.reuse else build(args.rows, args.unknown)
        c.log(f"table: {built['jobs']} jobs, {built['bytes_per_job']} bytes a job")
        if args.build_only:
            return 0
        data: dict[str, Any] = {
            "benchmark": "scale", "command": c.command_line(), "environment": environment(),
            "settings": vars(args), "table": built, "recovery": recovery(args.repeat)}
        c.log(f"recovery: {data['recovery']}")
        data["idem_status"] = status(args.repeat)
        c.log(f"idem_status: {data['idem_status']}")
        data["admin"] = admin_pages(args.repeat, built["jobs"])
        data["idem_purge"] = purge(args.purge_days)
        c.log(f"idem_purge: {data['idem_purge']}")
        data["table_after"] = table_sizes()
        data["loadavg_end"] = c.loadavg()
        c.write_result("scale", data, args.out)
    finally:
        if args.drop:
            c.drop_database(os.environ["IDEM_PG_NAME"])
    return 0



PREFIXES = ["order", "invoice", "mail", "ship", "refund", "report", "sync", "export",
            "import", "notify", "charge", "payout", "resize", "index", "audit", "webhook",
            "backup", "digest", "price", "stock"]
TASKS = [f"shop.tasks.{prefix}" for prefix in PREFIXES]
UNKNOWN_TASK = "shop.tasks.removed_in_last_deploy"
#: Out of 1000 jobs: SUCCEEDED below 980, FAILED below 990, RUNNING below 995, PENDING.
STATE_SQL = ("CASE WHEN s < 980 THEN 'SUCCEEDED' WHEN s < 990 THEN 'FAILED' "
             "WHEN s < 995 THEN 'RUNNING' ELSE 'PENDING' END")
LOAD_CHUNK = 500_000


def register_tasks() -> None:
    """The 20 tasks, registered in this process as the beat process would have them."""
    from celery import shared_task

    from celery_idem import IdempotentTask

    def body(self: Any, n: int, note: str = "") -> int:
        return n

    for prefix, name in zip(PREFIXES, TASKS, strict=True):
        shared_task(base=IdempotentTask, bind=True, name=name,
                    idempotency_key=prefix + "/{n}")(body)


def template_message() -> tuple[str, dict[str, Any]]:
    """A real job's namespace and stored message (~1.1 KB), published through the
    producer to the in-memory broker, then deleted."""
    from celery import current_app

    from celery_idem.models import Job

    task = current_app.tasks[TASKS[0]]
    task.delay(0, note="x" * 420)
    job = Job.objects.get(key="order/0")
    job.delete()
    return job.namespace, job.message


def _saved_schema(cursor: Any, table: str) -> list[tuple[str, str]]:
    """The secondary indexes and constraints of ``table`` as (drop, create) statements."""
    cursor.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = %s::regclass AND contype <> 'p'", [table])
    ddl = [(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"',
            f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
           for name, definition in cursor.fetchall()]
    cursor.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexname NOT IN "
        "(SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass)", [table, table])
    ddl += [(f'DROP INDEX "{name}"', definition) for name, definition in cursor.fetchall()]
    return ddl


def build(rows: int, unknown: int) -> dict[str, Any]:
    """Load ``rows`` jobs and ``unknown`` stale claims of an unknown task, with history."""
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE celery_idem_transition, celery_idem_checkpoint, "
                       "celery_idem_job RESTART IDENTITY")
        namespace, message = template_message()  # on the empty table (a rebuild's too)
        ddl = [d for table in ("celery_idem_transition", "celery_idem_checkpoint",
                               "celery_idem_job") for d in _saved_schema(cursor, table)]
        for drop, _ in ddl:
            cursor.execute(drop)
        cursor.execute("SET synchronous_commit = off")
        cursor.execute("SET maintenance_work_mem = '512MB'")
        for start in range(0, rows, LOAD_CHUNK):
            _load_jobs(cursor, start, min(rows, start + LOAD_CHUNK), rows, namespace, message)
            c.log(f"loaded {min(rows, start + LOAD_CHUNK)} of {rows} jobs")
        _load_unknown(cursor, unknown, namespace, message)
        cursor.execute(
            "INSERT INTO celery_idem_transition (job_id, event, from_state, to_state, attempt,"
            " worker, task_id, reason, actor, at)"
            " SELECT j.id, e.event, e.from_state, e.to_state, 1, j.worker, j.task_id, '', '',"
            " j.created_at + e.delay"
            " FROM celery_idem_job j CROSS JOIN LATERAL (VALUES"
            " ('claimed', 'PENDING', 'RUNNING', interval '0'),"
            " (CASE j.state WHEN 'SUCCEEDED' THEN 'succeeded' WHEN 'FAILED' THEN"
            "  CASE WHEN j.id %% 10 = 0 THEN 'dead_lettered' ELSE 'failed' END"
            "  WHEN 'RUNNING' THEN 'heartbeat' ELSE 'released' END,"
            "  'RUNNING', CASE WHEN j.state = 'RUNNING' THEN 'RUNNING'"
            "  WHEN j.state = 'PENDING' THEN 'PENDING' ELSE j.state END, interval '1 second'))"
            " AS e(event, from_state, to_state, delay)", [])
        # The dead_lettered move marks its job (states.MOVES): those with that history.
        cursor.execute("UPDATE celery_idem_job SET dead_lettered = true WHERE state = 'FAILED'"
                       " AND id %% 10 = 0", [])
        c.log("loaded the history; building indexes")
        for _, create in ddl:
            cursor.execute(create)
        cursor.execute("RESET synchronous_commit")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE celery_idem_job")
        cursor.execute("VACUUM ANALYZE celery_idem_transition")
    return {"build_s": round(time.perf_counter() - started, 1), **table_sizes()}


def _load_jobs(cursor: Any, start: int, stop: int, rows: int, namespace: str,
               message: dict[str, Any]) -> None:
    # g: the job's number; s: its state's draw (spread, not in runs); created over the 30
    # days up to now in id order, as a real table fills.
    cursor.execute(
        "INSERT INTO celery_idem_job (namespace, key, task_name, args, kwargs, fingerprint,"
        " options, message, sent_at, state, attempt, worker, task_id, lease_expires_at,"
        " dispatch_count, result, error, created_at, started_at, finished_at, updated_at)"
        " SELECT %(ns)s, (%(prefixes)s::text[])[1 + g %% 20] || '/' || g,"
        " (%(tasks)s::text[])[1 + g %% 20], jsonb_build_array(g), '{}'::jsonb,"
        " md5(g::text) || md5(g::text), '{}'::jsonb, %(message)s::jsonb, t, st,"
        " CASE WHEN st = 'PENDING' THEN 0 ELSE 1 END,"
        " CASE WHEN st = 'PENDING' THEN '' ELSE 'celery@host-' || g %% 8 || '/' || g %% 97 END,"
        " md5('t' || g)::uuid::text,"
        " CASE WHEN st = 'RUNNING' THEN t + interval '5 minutes' END, 0,"
        " CASE WHEN st = 'SUCCEEDED' THEN to_jsonb(g) END,"
        " CASE WHEN st = 'FAILED' THEN jsonb_build_object('type', 'ValueError',"
        "  'message', 'boom ' || g) END,"
        " t, CASE WHEN st <> 'PENDING' THEN t END,"
        " CASE WHEN st IN ('SUCCEEDED', 'FAILED') THEN t + interval '1 second' END,"
        " t + interval '1 second'"
        " FROM generate_series(%(start)s, %(stop)s - 1) g,"
        " LATERAL (SELECT (g::bigint * 7919) %% 1000 AS s) d,"
        " LATERAL (SELECT " + STATE_SQL + " AS st,"
        "  now() - interval '30 days' * (1 - g::float8 / %(rows)s)"
        "  - interval '1 hour' AS t) v",
        {"ns": namespace, "prefixes": PREFIXES, "tasks": TASKS, "message": json.dumps(message),
         "start": start, "stop": stop, "rows": rows})


def _load_unknown(cursor: Any, unknown: int, namespace: str, message: dict[str, Any]) -> None:
    cursor.execute(
        "INSERT INTO celery_idem_job (namespace, key, task_name, args, kwargs, fingerprint,"
        " options, message, sent_at, state, attempt, worker, task_id, lease_expires_at,"
        " dispatch_count, created_at, started_at, updated_at)"
        " SELECT %s, 'legacy/' || g, %s, jsonb_build_array(g), '{}'::jsonb, md5(g::text),"
        " '{}'::jsonb, %s::jsonb, t, 'RUNNING', 1, 'celery@old/1',"
        " md5('u' || g)::uuid::text, now() - interval '1 hour', 0, t, t, t"
        " FROM generate_series(1, %s) g,"
        " LATERAL (SELECT now() - interval '2 hours' - g * interval '1 millisecond' AS t) v",
        [namespace, UNKNOWN_TASK, json.dumps(message), unknown])


def table_sizes() -> dict[str, Any]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM celery_idem_job")
        jobs = cursor.fetchone()[0]
        cursor.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid) "
            "FROM pg_class c WHERE c.relname LIKE 'celery_idem_%%' AND c.relkind IN ('r', 'i') "
            "ORDER BY 2 DESC")
        sizes = {name: {"total_mb": round(total / 2**20), "own_mb": round(own / 2**20)}
                 for name, total, own in cursor.fetchall()}
        cursor.execute("SELECT avg(pg_column_size(message)) FROM celery_idem_job"
                       " TABLESAMPLE SYSTEM (1) WHERE message IS NOT NULL")
        message_bytes = float(cursor.fetchone()[0] or 0)
    job_bytes = 2**20 * sizes.get("celery_idem_job", {}).get("total_mb", 0)
    return {"jobs": jobs, "relations": sizes, "avg_message_bytes": round(message_bytes),
            "bytes_per_job": round(job_bytes / jobs) if jobs else None}


def timed(action: Any, repeat: int) -> dict[str, Any]:
    """Median, min and max milliseconds of ``repeat`` runs of ``action``."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(1e3 * (time.perf_counter() - started))
    return {"median_ms": round(statistics.median(times), 1), "min_ms": round(min(times), 1),
            "max_ms": round(max(times), 1)}


def recovery(repeat: int) -> dict[str, Any]:
    from django.db import connection
    from django.utils import timezone

    from celery_idem.recovery import reap

    out: dict[str, Any] = {}
    with connection.cursor() as cursor:  # stale again, on a table reused (--reuse)
        cursor.execute("UPDATE celery_idem_job SET lease_expires_at = now() - interval '1 hour'"
                       " WHERE task_name = %s", [UNKNOWN_TASK])
    started = time.perf_counter()
    first = reap(now=timezone.now() - timedelta(seconds=first_pass_lag()))
    out["first_pass"] = {"ms": round(1e3 * (time.perf_counter() - started), 1),
                         "did": {a: first.total(a) for a in first.as_dict()}}
    reports: list[Any] = []
    out["unknown_task_claims_pass"] = timed(lambda: reports.append(reap()), repeat)
    out["unknown_task_claims_pass"]["did"] = {a: reports[-1].total(a)
                                              for a in reports[-1].as_dict()}
    with connection.cursor() as cursor:  # the unknown task's claims: a live lease now
        cursor.execute("UPDATE celery_idem_job SET lease_expires_at = now() + interval '1 day'"
                       " WHERE task_name = %s", [UNKNOWN_TASK])
    reports.clear()
    out["nothing_to_do_pass"] = timed(lambda: reports.append(reap()), repeat)
    out["nothing_to_do_pass"]["did"] = reports[-1].as_dict()
    return out


def first_pass_lag() -> float:
    """Seconds before now the first pass runs at (its clock moved back, ``reap(now=...)``):
    then the jobs it sends again are, when the rest is timed, as an operator finds them a
    while after an outage: past the dispatch timeout since that re-send, not yet due for
    the next one (whose wait doubled). A pass and idem_status must not read them one by
    one. (Moving the clock rather than their rows leaves no more row versions behind than
    a real pass does.)"""
    from celery_idem.recovery.due import redispatch_wait

    return (redispatch_wait(0) + redispatch_wait(1)) / 2


def status(repeat: int) -> dict[str, Any]:
    from django.core.management import call_command

    def run(*args: str) -> None:
        call_command("idem_status", *args, stdout=StringIO())

    return {"default": timed(run, repeat), "exact": timed(lambda: run("--exact"), repeat)}


def admin_pages(repeat: int, jobs: int) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from celery_idem.models import Job

    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    base = "/admin/celery_idem/job/"
    some = Job.objects.filter(state="FAILED").order_by("id").values("id", "key").first()
    far = max(1, min(100, jobs // 50 - 1))  # page 100, or the last but one of a small table
    pages = {"list": "", "page far down": f"?p={far}",
             "key search exact": f"?q={some['key']}", "key prefix search order/": "?q=order/",
             "task id search": "?q=" + str(Job.objects.values_list("task_id", flat=True)
                                           .filter(id=some["id"]).get()),
             "task name filter": f"?task_name={TASKS[3]}",
             "claim=stale": "?claim=stale", "claim=live": "?claim=live",
             "dead-lettered=yes": "?dead_lettered=yes", "dead-lettered=no": "?dead_lettered=no",
             "detail": f"{some['id']}/change/", "history": f"{some['id']}/history/"}
    pages |= {f"state={s}": f"?state__exact={s}" for s in
              ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "UNCERTAIN", "EXPIRED")}
    pages |= {"state=FAILED and task name": f"?state__exact=FAILED&task_name={TASKS[3]}",
              "dead-lettered=yes and task name": f"?dead_lettered=yes&task_name={TASKS[3]}"}
    # The date filter's choices, as its links write them; the sortable columns.
    today = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    for label, since, until in [
            ("today", today, today + timedelta(days=1)),
            ("past 7 days", today - timedelta(days=7), today + timedelta(days=1)),
            ("this month", today.replace(day=1), None),
            ("this year", today.replace(month=1, day=1), None)]:
        query = {"created_at__gte": str(since), **({"created_at__lt": str(until)} if until else {})}
        pages[f"created {label}"] = "?" + urlencode(query)
    pages |= {"sorted by key": "?o=1", "sorted by key, descending": "?o=-1",
              "sorted by task name": "?o=2", "sorted oldest first": "?o=6"}
    out: dict[str, Any] = {}
    for label, tail in pages.items():
        url = base + tail
        response = client.get(url)  # warm: the first render compiles templates
        assert response.status_code == 200, (url, response.status_code)
        connection.queries_log.clear()  # full (maxlen 9,000), it would capture nothing
        with CaptureQueriesContext(connection) as queries:
            client.get(url)
        out[label] = {"url": url, **timed(lambda u=url: client.get(u), repeat),
                      "queries": len(queries.captured_queries)}
        c.log(f"admin {label}: {out[label]['median_ms']} ms")
    return out


def purge(days: float) -> dict[str, Any]:
    """idem_purge of the jobs finished more than ``days`` ago, while a thread inserts a
    job every 10 ms on its own connection and records each insert's latency."""
    import psycopg
    from django.core.management import call_command
    from django.db import connection

    settings = connection.settings_dict
    stop = threading.Event()
    latencies: list[float] = []

    def insert() -> None:
        with psycopg.connect(dbname=settings["NAME"], user=settings["USER"],
                             host=settings["HOST"], port=settings["PORT"],
                             autocommit=True) as conn:
            n = 0
            while not stop.is_set():
                n += 1
                started = time.perf_counter()
                conn.execute(
                    "INSERT INTO celery_idem_job (namespace, key, task_name, fingerprint,"
                    " options, state, attempt, worker, task_id, dispatch_count, created_at,"
                    " updated_at) VALUES ('bench', 'purge-probe/' || %s, 'probe', 'fp',"
                    " '{}', 'PENDING', 0, '', '', 0, now(), now())", [f"{os.getpid()}-{n}"])
                latencies.append(1e3 * (time.perf_counter() - started))
                stop.wait(0.01)

    thread = threading.Thread(target=insert, daemon=True)
    thread.start()
    out = StringIO()
    started = time.perf_counter()
    call_command("idem_purge", "--older-than", str(days), stdout=out)
    seconds = time.perf_counter() - started
    stop.set()
    thread.join(timeout=30)
    deleted = int(out.getvalue().split()[1])
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM celery_idem_job WHERE key LIKE 'purge-probe/%%'")
    return {"older_than_days": days, "deleted_jobs": deleted, "seconds": round(seconds, 1),
            "jobs_per_s": round(deleted / seconds) if seconds else None,
            "inserts": len(latencies),
            "insert_median_ms": round(statistics.median(latencies), 2) if latencies else None,
            "insert_worst_ms": round(max(latencies), 1) if latencies else None}
