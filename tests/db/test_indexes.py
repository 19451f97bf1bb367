"""The job table keeps only the indexes a query needs, partial where the query names a
state, and (PostgreSQL) leaves room on each page for a row's next version
(celery_idem/schema.py); the unique key leads with the key, so it also serves the search
by key prefix.
"""

from __future__ import annotations

import pytest
from django.db import connection

from celery_idem.models import Job

pytestmark = pytest.mark.django_db

#: Each index of the job table and the condition it keeps rows under ("" for all rows).
EXPECTED = {
    "celery_idem_job_lease_idx": "RUNNING",
    "celery_idem_job_pending_idx": "PENDING",
    "celery_idem_job_attention_idx": "FAILED",
    "celery_idem_job_census_idx": "SUCCEEDED",
    "celery_idem_job_dead_idx": "dead_lettered",
    "celery_idem_job_expiry_idx": "expires_at",
    "celery_idem_job_unsent_idx": "sent_at",
    "celery_idem_job_parent_idx": "parent_id",
    "celery_idem_job_created_idx": "",
    "celery_idem_job_task_idx": "",
    "celery_idem_job_task_id_idx": "",
}


def job_indexes() -> dict[str, str]:
    """The job table's secondary indexes (not the primary key or the unique key) and their
    definitions."""
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s",
                           [table])
        else:
            cursor.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' "
                           "AND tbl_name = %s AND sql IS NOT NULL", [table])
        found = dict(cursor.fetchall())
    return {name: sql for name, sql in found.items()
            if not name.endswith(("_pkey", "_key_uniq"))}


#: MySQL/MariaDB have no partial indexes: each one's plain columns (celery_idem/schema.py).
PLAIN = {
    "celery_idem_job_lease_idx": ["state", "lease_expires_at"],
    "celery_idem_job_pending_idx": ["state", "dispatch_count", "updated_at"],
    "celery_idem_job_attention_idx": ["state", "created_at"],
    "celery_idem_job_census_idx": ["state", "task_name"],
    "celery_idem_job_parent_idx": ["parent_id"],
    "celery_idem_job_created_idx": ["created_at"],
    "celery_idem_job_task_idx": ["task_name", "created_at"],
    "celery_idem_job_task_id_idx": ["task_id"],
}

on_mysql = pytest.mark.skipif(connection.vendor != "mysql", reason="MySQL/MariaDB's layout")
not_on_mysql = pytest.mark.skipif(connection.vendor == "mysql",
                                  reason="no partial indexes there: see the plain ones' test")


@on_mysql
def test_without_partial_indexes_the_state_indexes_are_plain_and_led_by_the_state():
    """The reaper's ranges (state = RUNNING and lease_expires_at < now; state = PENDING
    and updated_at < cutoff) read only their state's rows, not every finished job."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, Job._meta.db_table)
    found = {name: info["columns"] for name, info in constraints.items()
             if info["index"] and not info["unique"] and not info["foreign_key"]}
    assert found == PLAIN


@not_on_mysql
def test_only_the_indexes_a_query_needs_partial_where_a_state_is_named():
    found = job_indexes()
    assert set(found) == set(EXPECTED)
    for name, condition in EXPECTED.items():
        where = found[name].split(" WHERE ", 1)[1] if " WHERE " in found[name] else ""
        assert condition in where, (name, found[name])
        assert bool(where) == bool(condition), (name, found[name])


def test_the_unique_key_leads_with_the_key_and_serves_the_key_prefix_search():
    """No index of its own on ``key``: the unique (key, namespace) index answers the
    admin's search by key prefix (a range on the key, across namespaces)."""
    from celery_idem.admin.changelist import key_prefix

    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, Job._meta.db_table)
    unique = constraints["celery_idem_job_key_uniq"]
    assert unique["unique"] and unique["columns"] == ["key", "namespace"], unique
    if connection.vendor != "postgresql":
        return
    query = Job.objects.filter(**key_prefix("bench/12")).order_by("key")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # an empty table: ask for the index
        plan = query.explain()
    assert "celery_idem_job_key_uniq" in plan, plan


def test_job_pages_keep_room_for_the_next_row_version():
    if connection.vendor != "postgresql":
        pytest.skip("fillfactor is PostgreSQL's (other databases ignore it)")
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s",
                       [Job._meta.db_table])
        (options,) = cursor.fetchone()
    assert "fillfactor=70" in options


def test_the_dead_lettered_jobs_are_read_from_a_partial_index_of_them_alone():
    """The admin's dead-lettered filter and idem_status read the rows the
    ``dead_lettered`` move flagged, from an index of those alone, not
    from the history (which has no index of its own for it any more)."""
    from celery_idem.models import Transition

    with connection.cursor() as cursor:
        history = connection.introspection.get_constraints(cursor, Transition._meta.db_table)
    assert "celery_idem_dead_letter_idx" not in history
    if connection.vendor != "postgresql":
        pytest.skip("EXPLAIN's wording is PostgreSQL's")
    query = Job.objects.dead_lettered().order_by("-created_at").values("pk")[:10]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # an empty table: ask for the index
        plan = query.explain()
    assert "celery_idem_job_dead_idx" in plan, plan


@not_on_mysql
def test_the_recovery_sweeps_of_pending_jobs_read_an_index_range():
    """Expired, sent and lost, never sent: each sweep of the pass is the range of an
    index, not a read of every PENDING job (MySQL/MariaDB: the (state, dispatch_count,
    updated_at) index, checked above)."""
    from django.db import transaction
    from django.utils import timezone

    from celery_idem.recovery import due

    if connection.vendor != "postgresql":
        pytest.skip("EXPLAIN's wording is PostgreSQL's")
    now = timezone.now()
    # PENDING jobs none of the sweeps wants (sent just now, no expiry), analysed: each
    # sweep's range is then the cheap way, whatever the statistics left by other tests.
    Job.objects.bulk_create(Job(namespace="n", key=f"fresh/{n}", task_name="t", state="PENDING",
                                fingerprint="f", sent_at=now, updated_at=now)
                            for n in range(300))
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    sweeps = [(due.expired(now), ["expires_at <"]), (due.never_sent(now), ["created_at <"])]
    # Sent and lost: a range per re-dispatch count, on the count and the last write.
    sweeps += [(level, ["dispatch_count", "updated_at <"]) for level in due.sent_and_lost(now)]
    assert len(sweeps) > 3
    for condition, bounds in sweeps:
        query = Job.objects.filter(condition, id__gt=0).order_by("id")[:500]
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")  # an empty table
            cursor.execute("SET LOCAL enable_bitmapscan = off")
            plan = query.explain()
        ranges = [line for line in plan.splitlines() if "Index Cond" in line]
        assert any(all(b in line for b in bounds) for line in ranges), (bounds, plan)
