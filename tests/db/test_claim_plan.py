"""The PostgreSQL claim finds its row through the key, whatever the statistics say.

Right after a burst of enqueues, and until autoanalyze runs, the statistics still say
PENDING rows are rare. A claim filtering on key and state together was then planned on
the (state, updated_at) index and scanned the whole backlog for its one key.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from celery_idem import states
from celery_idem.backends import queries, routines

pytestmark = pytest.mark.django_db(transaction=True)  # PostgreSQL only: see conftest


#: The index that finds a job by its key: the unique constraint's, (key, namespace).
KEY_PROBES = {"celery_idem_job_key_uniq"}


def load_finished_jobs(count: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO celery_idem_job (namespace, key, task_name, fingerprint, options,"
            " state, attempt, worker, task_id, dispatch_count, created_at, updated_at)"
            " SELECT 'plan', 'k' || g, 'tests.plan', 'fp', '{}'::jsonb, 'SUCCEEDED', 1, '',"
            " 't' || g, 0, now(), now() FROM generate_series(1, %s) g", [count])
        cursor.execute("ANALYZE celery_idem_job")


def scans(node: dict) -> list[tuple[str, str | None]]:
    """(node type, index name) of every scan in a JSON plan."""
    found = []
    if node.get("Node Type", "").endswith("Scan"):
        found.append((node["Node Type"], node.get("Index Name")))
    for child in node.get("Plans", []):
        found.extend(scans(child))
    return found


def test_claim_probes_the_key_even_when_statistics_say_pending_rows_are_rare():
    load_finished_jobs(5000)
    with connection.cursor() as cursor:
        # A backlog the statistics have not seen yet.
        cursor.execute("UPDATE celery_idem_job SET state = 'PENDING', attempt = 0"
                       " WHERE namespace = 'plan' AND id % 2 = 0")
        cursor.execute("SELECT key, fingerprint FROM celery_idem_job"
                       " WHERE state = 'PENDING' ORDER BY id DESC LIMIT 1")
        key, fingerprint = cursor.fetchone()
        now = timezone.now()
        params = {
            "namespace": "plan", "key": key, "fingerprint": fingerprint, "worker": "w",
            "task_id": "t-new", "lease": now + timedelta(hours=1), "now": now,
            "event": "claimed", "from_state": "PENDING", "to_state": "RUNNING", "reason": "",
            "duplicate": "duplicate", "duplicate_reason": "",
            "duplicate_sources": states.move("duplicate").source_values(),
        }
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + queries.claim_sql("claimed"),
                       params)
        raw = cursor.fetchone()[0]
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    used = scans(plan)
    job_indexes = {index for _, index in used if index}
    assert "celery_idem_job_pkey" in job_indexes, used
    assert job_indexes <= KEY_PROBES | {"celery_idem_job_pkey"}, used
    assert not any(node == "Seq Scan" for node, _ in used), used


def test_the_claim_routine_probes_the_key_in_its_cached_plans_too():
    """The same backlog, claimed through the stored routine (backends/routines.py) nine
    times: PL/pgSQL plans the first calls for their parameters, then may keep one generic
    plan for all; every plan, as auto_explain reports it from inside the function,
    probes the key."""
    claim = next(r for r in routines.hot() if r.label == "claim")
    load_finished_jobs(5000)
    plans: list[dict] = []

    def collect(notice):
        text = notice.message_primary or ""
        if "plan:" in text and "celery_idem_job" in text:
            plans.append(json.loads(text.split("plan:", 1)[1])["Plan"])

    with connection.cursor() as cursor:
        raw = connection.connection
        cursor.execute("UPDATE celery_idem_job SET state = 'PENDING', attempt = 0"
                       " WHERE namespace = 'plan' AND id % 2 = 0")
        cursor.execute("SELECT key, fingerprint FROM celery_idem_job"
                       " WHERE state = 'PENDING' ORDER BY id DESC LIMIT 9")
        pending = cursor.fetchall()
        # Session settings of this test's connection only (closed below).
        cursor.execute("LOAD 'auto_explain'")
        for name, value in [("log_min_duration", "0"), ("log_nested_statements", "on"),
                            ("log_level", "notice"), ("log_format", "json")]:
            cursor.execute(f"SET auto_explain.{name} = '{value}'")
        raw.add_notice_handler(collect)
        try:
            for n, (key, fingerprint) in enumerate(pending):
                now = timezone.now()
                cursor.execute(claim.call, {
                    "unflushed": False, "namespace": "plan", "key": key, "fingerprint": fingerprint,
                    "worker": "w", "task_id": f"t-{n}", "lease": now + timedelta(hours=1),
                    "now": now, "from_state": "PENDING", "to_state": "RUNNING"})
                assert cursor.fetchone()[0] is True  # won
        finally:
            raw.remove_notice_handler(collect)
            connection.close()
    assert len(plans) == len(pending), plans
    for plan in plans:
        used = scans(plan)
        job_indexes = {index for _, index in used if index}
        assert job_indexes <= KEY_PROBES | {"celery_idem_job_pkey"}, used
        assert not any(node == "Seq Scan" for node, _ in used), used
