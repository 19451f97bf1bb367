"""A running ``atomic=True`` job is visible while its body holds its transaction open,
with a real worker: in ``census.running_atomic``, ``idem_status``, the metrics' gauges and
the admin (PostgreSQL and MariaDB, from the row locks of the body's transaction). On
SQLite its row reads PENDING, and every reader says that it cannot tell. Looking never
holds the body up: it commits, once, when let go.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from celery_idem.census import running_atomic
from celery_idem.conf import settings as idem_settings
from celery_idem.metrics.gauges import read
from celery_idem.models import Job
from django_app.effects.models import Effect
from django_app.effects.tasks import wait_for_file_atomic

from .workers import Worker, wait_until

TIMEOUT = 120
VISIBLE = settings.DATABASE_KIND != "sqlite"
TASK = wait_for_file_atomic.name


@pytest.fixture
def held(broker_service, transactional_db, tmp_path: Path) -> Iterator[Job]:
    """An atomic body that holds its transaction open until the test ends."""
    with Worker(concurrency=1):
        sent = wait_for_file_atomic.delay("seen", str(tmp_path))
        wait_until(lambda: (tmp_path / "seen.started").exists(), TIMEOUT,
                   what="the atomic body to start")
        job = Job.objects.get(key="wait-atomic/seen")
        assert job.state == "PENDING" and job.attempt == 0  # what the row says
        yield job
        (tmp_path / "seen").touch()
        assert sent.get(timeout=TIMEOUT) == "seen"
    assert Job.objects.get(pk=job.pk).state == "SUCCEEDED"
    assert Effect.objects.filter(key="wait-atomic/seen").count() == 1


def test_running_atomic_names_the_job(held):
    found = running_atomic()
    assert found.visible is VISIBLE
    if not VISIBLE:
        assert found.jobs == []
        return
    assert [(job.id, job.key, job.task_name, job.attempt) for job in found.jobs] == [
        (held.id, "wait-atomic/seen", TASK, 0)]
    since = found.jobs[0].since
    if settings.DATABASE_KIND == "postgres":  # when the body's transaction started
        assert since is not None and since <= timezone.now()
    assert running_atomic(ids=[held.id]).jobs == found.jobs
    assert running_atomic(ids=[held.id + 1000]).jobs == []


def test_idem_status_counts_it_running(held):
    out = StringIO()
    call_command("idem_status", "--json", stdout=out)
    status = json.loads(out.getvalue())
    text = StringIO()
    call_command("idem_status", stdout=text)
    if not VISIBLE:
        assert status["counts"][TASK] == {"PENDING": 1}
        assert status["running_atomic"] is None and status["oldest_running"] is None
        assert "Running atomic jobs: not visible on this database" in text.getvalue()
        return
    assert status["counts"][TASK] == {"RUNNING": 1}
    assert status["running_atomic"] == {TASK: 1}
    oldest = status["oldest_running"]
    assert (oldest["id"], oldest["attempt"], oldest["atomic"]) == (held.id, 1, True)
    assert f"job {held.id} " in text.getvalue()
    assert "atomic, in its transaction" in text.getvalue()


def test_the_gauges_count_it_running(held):
    jobs = read(idem_settings.DATABASE, timezone.now(), 100).jobs
    expected = {(TASK, "RUNNING"): 1} if VISIBLE else {(TASK, "PENDING"): 1}
    assert {k: n for k, n in jobs.items() if k[0] == TASK} == expected


def test_the_admin_shows_it_running(admin_client, held):
    """The change list and the detail page show it running. (admin_client comes first:
    its user is written before the body takes SQLite's one write lock.)"""
    label = "Running (atomic, in transaction)"
    listing = admin_client.get(reverse("admin:celery_idem_job_changelist")).content.decode()
    page = admin_client.get(reverse("admin:celery_idem_job_change", args=[held.pk]))
    assert (label in listing) is VISIBLE
    assert (label in page.content.decode()) is VISIBLE
