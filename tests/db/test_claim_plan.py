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
from celery_idem.backends import queries

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
