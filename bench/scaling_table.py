"""The job table bench/scaling.py grows: bulk-loaded finished jobs with their history,
its row count, and a backlog of PENDING jobs made from them. Apart from what is measured
on it (scaling_claims.py, scaling_recovery.py, scaling_admin.py).
"""

from __future__ import annotations

import time

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
