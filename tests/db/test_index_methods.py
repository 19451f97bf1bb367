"""On PostgreSQL the task id's index is a hash index (smaller entries to log on every claim
and commit, celery_idem/schema.py HASH_INDEXES), which the admin's search by task id
uses; elsewhere it is Django's B-tree."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from celery_idem.models import Job
from celery_idem.schema import HASH_INDEXES

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
