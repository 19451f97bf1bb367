"""Migration 0012: on PostgreSQL the task id's index is a hash index (smaller entries to
log on every claim and commit, celery_idem/schema.py HASH_INDEXES); elsewhere nothing
changes. The migration applies, runs again and unapplies on every database, and the
jobs already there stay found by task id."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.db import connection, transaction

from celery_idem.models import Job
from celery_idem.schema import HASH_INDEXES

ROOT = Path(__file__).resolve().parents[2]
INDEX = "celery_idem_job_task_id_idx"
pytestmark = pytest.mark.django_db(transaction=True)


def test_the_task_id_index_is_a_hash_index_on_postgresql_and_serves_the_search():
    from celery_idem.admin.job import JobAdmin

    assert INDEX in HASH_INDEXES
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, Job._meta.db_table)
    assert found[INDEX]["columns"] == ["task_id"]
    if connection.vendor != "postgresql":
        return  # a B-tree (Django's) elsewhere: nothing to check beyond its column
    assert found[INDEX]["type"] == "hash", found[INDEX]
    from django.contrib import admin

    queryset, _ = JobAdmin(Job, admin.site).get_search_results(
        None, Job.objects.all(), "0b6f0f53-1d2a-4c6e-9d7e-4cbd3c6a0a11")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # an empty table: ask for the index
        plan = queryset.explain()
    assert INDEX in plan, plan


def _in(database: str, *argv: str) -> str:
    """``manage.py`` (django-admin on the test project) against ``database``."""
    env = {**os.environ, "IDEM_DB_NAME": database,
           "DJANGO_SETTINGS_MODULE": "django_app.settings"}
    done = subprocess.run([sys.executable, "-m", "django", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _probe(database: str, before: str = "") -> list[str]:
    """What ``_PROBE`` printed, after running ``before`` (its last line: the shell may
    say more before it)."""
    return _in(database, "shell", "-c", before + _PROBE).strip().splitlines()[-1].split(" ", 1)


#: Run in the migrated database: the index's method (PostgreSQL) or "-", and the keys of
#: the jobs found by task id.
_PROBE = """
from django.db import connection
from celery_idem.models import Job
method = "-"
if connection.vendor == "postgresql":
    with connection.cursor() as cursor:
        cursor.execute("SELECT am.amname FROM pg_class c JOIN pg_am am ON am.oid = c.relam "
                       "WHERE c.relname = 'celery_idem_job_task_id_idx'")
        method = cursor.fetchone()[0]
print(method, sorted(Job.objects.filter(task_id="t-old").values_list("key", flat=True)))
"""
_OLD_ROW = """
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone
state = MigrationLoader(connection).project_state(("celery_idem", "0011_pending_sweep_indexes"))
Job = state.apps.get_model("celery_idem", "Job")  # the model as 0011 left it
Job.objects.create(namespace="n", key="old", task_name="t", fingerprint="f",
                   task_id="t-old", message={"v": 1}, created_at=timezone.now())
"""


@pytest.fixture
def scratch_database(tmp_path):
    """A database of its own, dropped afterwards (its name, or its file on SQLite)."""
    if connection.vendor == "sqlite":
        yield str(tmp_path / "migrations.sqlite3")
        return
    name = f"idem_migrations_{uuid.uuid4().hex[:8]}"
    create = ("CREATE DATABASE {} CHARACTER SET utf8mb4" if connection.vendor == "mysql"
              else "CREATE DATABASE {}")
    with connection.cursor() as cursor:
        cursor.execute(create.format(name))
    try:
        yield name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE {name}")


def test_0012_applies_runs_again_and_unapplies_keeping_the_jobs(scratch_database):
    hashed = "hash" if connection.vendor == "postgresql" else "-"
    btree = "btree" if connection.vendor == "postgresql" else "-"
    _in(scratch_database, "migrate", "celery_idem", "0011_pending_sweep_indexes")
    assert _probe(scratch_database, _OLD_ROW) == [btree, "['old']"]  # a job from before
    _in(scratch_database, "migrate", "celery_idem", "0012_hash_task_id_index")
    assert _probe(scratch_database) == [hashed, "['old']"]
    # Again over its own work (recorded as unapplied, the index already a hash index).
    _in(scratch_database, "migrate", "celery_idem", "0011_pending_sweep_indexes", "--fake")
    _in(scratch_database, "migrate", "celery_idem", "0012_hash_task_id_index")
    assert _probe(scratch_database) == [hashed, "['old']"]
    _in(scratch_database, "migrate", "celery_idem", "0011_pending_sweep_indexes")
    assert _probe(scratch_database) == [btree, "['old']"]
