"""celery_idem.census: jobs per task and state, exact for the states an operator acts on,
SUCCEEDED estimated from PostgreSQL's statistics unless asked to count."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from celery_idem.census import JobCount, job_counts, running_atomic
from celery_idem.models import Job

pytestmark = pytest.mark.django_db(transaction=True)

on_postgres = pytest.mark.skipif(connection.vendor != "postgresql",
                                 reason="the estimate is PostgreSQL's statistics")


def jobs(task: str, state: str, n: int) -> None:
    Job.objects.bulk_create(
        Job(namespace="census", key=f"{task}/{state}/{i}", task_name=task, state=state,
            fingerprint="fp") for i in range(n))


def analyse() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")


def test_exact_counts_every_state_of_every_task():
    jobs("a", "SUCCEEDED", 30)
    jobs("a", "FAILED", 2)
    jobs("b", "PENDING", 3)
    assert job_counts(exact=True) == [JobCount("a", "FAILED", 2, True),
                                      JobCount("a", "SUCCEEDED", 30, True),
                                      JobCount("b", "PENDING", 3, True)]


def test_elsewhere_or_before_any_analyse_every_count_is_exact():
    jobs("a", "SUCCEEDED", 5)
    jobs("a", "RUNNING", 1)
    assert job_counts() == job_counts(exact=True)


@on_postgres
def test_succeeded_is_estimated_and_labelled_the_rest_counted():
    jobs("a", "SUCCEEDED", 600)
    jobs("b", "SUCCEEDED", 300)
    jobs("a", "FAILED", 7)
    jobs("b", "PENDING", 4)
    analyse()
    jobs("b", "RUNNING", 2)  # after the statistics: the rare states are still exact
    counts = {(c.task_name, c.state): c for c in job_counts()}
    assert counts[("a", "FAILED")] == JobCount("a", "FAILED", 7, True)
    assert counts[("b", "PENDING")] == JobCount("b", "PENDING", 4, True)
    assert counts[("b", "RUNNING")] == JobCount("b", "RUNNING", 2, True)
    # ANALYZE read every row of so small a table: a's estimate is its count; b's is the
    # 304 rows analysed less its 6 rare jobs now (the 2 RUNNING came after): an estimate.
    assert counts[("a", "SUCCEEDED")] == JobCount("a", "SUCCEEDED", 600, False)
    assert counts[("b", "SUCCEEDED")] == JobCount("b", "SUCCEEDED", 298, False)


@on_postgres
def test_the_rare_states_are_counted_from_the_census_index_alone():
    jobs("a", "FAILED", 3)
    analyse()
    query = Job.objects.exclude(state="SUCCEEDED").values("task_name", "state")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a tiny table: ask for the index
        plan = query.explain()
    assert "Index Only Scan using celery_idem_job_census_idx" in plan, plan


def test_running_atomic_jobs_count_running_not_pending():
    """A running atomic job's row reads PENDING: the counts move it to RUNNING, and a
    task with no committed RUNNING job gets that count (exact)."""
    from celery_idem.census import HeldJob, RunningAtomic, with_running_atomic

    counts = [JobCount("a", "PENDING", 3, True), JobCount("a", "SUCCEEDED", 9, False),
              JobCount("b", "PENDING", 1, True), JobCount("b", "RUNNING", 2, True)]
    held = RunningAtomic([HeldJob(1, "a", "k1", "a", 0, None),
                          HeldJob(2, "a", "k2", "a", 0, None),
                          HeldJob(3, "b", "k3", "b", 4, None)], True)
    assert with_running_atomic(counts, held) == [
        JobCount("a", "PENDING", 1, True), JobCount("a", "RUNNING", 2, True),
        JobCount("a", "SUCCEEDED", 9, False), JobCount("b", "RUNNING", 3, True)]
    assert with_running_atomic(counts, RunningAtomic([], False)) == counts


def test_running_atomic_finds_nothing_without_an_open_transaction():
    jobs("a", "PENDING", 2)
    found = running_atomic()
    assert found.jobs == [] and found.visible is (connection.vendor != "sqlite")
