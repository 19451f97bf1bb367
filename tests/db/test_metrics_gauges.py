"""The metrics' gauges read from the tier's database: jobs per task and state (through
census.job_counts), the oldest stale claim, the oldest never-sent intent; cached."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client import CollectorRegistry

from celery_idem.metrics.gauges import Gauges, read
from celery_idem.metrics.prometheus import JobGauges
from celery_idem.metrics.recorder import OTHER
from celery_idem.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def job(key: str, state: str, task: str = "shop.ship", **fields) -> Job:
    return Job.objects.create(namespace="gauges", key=key, task_name=task, state=state,
                              fingerprint="fp", **fields)


def test_the_gauges_read_jobs_per_state_and_the_oldest_stuck_rows():
    now = timezone.now()
    for i in range(3):
        job(f"done/{i}", "SUCCEEDED", sent_at=now, attempt=1)
    job("stale", "RUNNING", attempt=1, sent_at=now, lease_expires_at=now - timedelta(seconds=120))
    job("live", "RUNNING", attempt=1, sent_at=now, lease_expires_at=now + timedelta(seconds=600))
    job("unsent", "PENDING", created_at=now - timedelta(seconds=50))
    job("sent", "PENDING", sent_at=now, created_at=now - timedelta(seconds=500))
    job("other-task", "PENDING", task="shop.bill", sent_at=now)

    reading = read("default", now, max_tasks=10)

    assert reading.jobs == {("shop.ship", "SUCCEEDED"): 3, ("shop.ship", "RUNNING"): 2,
                            ("shop.ship", "PENDING"): 2, ("shop.bill", "PENDING"): 1}
    assert reading.oldest_stale_claim == pytest.approx(120)
    assert reading.oldest_never_sent == pytest.approx(50)
    assert reading.up


def test_nothing_stuck_reads_zero_and_tasks_past_the_limit_are_other():
    job("a", "PENDING", task="a", sent_at=timezone.now())
    job("b", "PENDING", task="b", sent_at=timezone.now())
    reading = read("default", timezone.now(), max_tasks=1)
    assert reading.jobs == {("a", "PENDING"): 1, (OTHER, "PENDING"): 1}
    assert (reading.oldest_stale_claim, reading.oldest_never_sent) == (0.0, 0.0)


def test_a_scrape_within_the_cache_period_reads_the_database_once():
    registry = CollectorRegistry()
    registry.register(JobGauges(Gauges(ttl=3600)))
    job("first", "FAILED")
    assert registry.get_sample_value("celery_idem_jobs",
                                     {"task": "shop.ship", "state": "FAILED"}) == 1
    job("second", "FAILED")
    assert registry.get_sample_value("celery_idem_jobs",
                                     {"task": "shop.ship", "state": "FAILED"}) == 1
    fresh = Gauges(ttl=0).read()
    assert fresh.jobs[("shop.ship", "FAILED")] == 2
