"""The realistic job table bench/scale.py times its actions on: its 20 tasks and their
key prefixes, the mix of states, a real stored message, the bulk build (indexes dropped
and built again around the load) and the table's sizes. Apart from the actions timed on
it (scale_actions.py): how the table is made is not what is measured.
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench import _common as c

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
