"""bench/scaling.py's recovery pass at one table size: an idle pass, the plans of its
queries, then a pass over stale claims, its sending to the broker timed apart. Apart
from the claim and admin measurements of a size (scaling_claims.py, scaling_admin.py).
"""

from __future__ import annotations

import time
from typing import Any

from bench.query_plan import explain


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
