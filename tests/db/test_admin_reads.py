"""Reading the admin changes nothing: no page render, list filter, search or detail page
writes a job, its history, checkpoints or leases, or publishes a message (issue 20: a
trial saw 25,000 PENDING jobs re-dispatched while admin pages were being loaded; the
admin was not the cause, and this keeps it so)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone
from kombu import Producer

from celery_idem.models import Checkpoint, Job, Lease, Transition
from celery_idem.states import State
from tests.browser.jobs import make_job, populate

pytestmark = pytest.mark.django_db

LIST = "/admin/celery_idem/job/"


def snapshot() -> list[list[dict[str, Any]]]:
    return [list(model.objects.order_by("pk").values())
            for model in (Job, Transition, Checkpoint, Lease)]


def every_page(jobs: list[Job]) -> list[str]:
    queries = ["", "?p=2", "?o=1", "?o=-3", "?q=charge/", "?q=charge/order-1044",
               "?claim=stale", "?claim=live", "?dead_lettered=yes", "?dead_lettered=no",
               "?task_name=shop.tasks.charge_card",
               "?created_at__gte=2000-01-01+00%3A00%3A00%2B00%3A00",
               *(f"?state__exact={state.value}" for state in State),
               "?state__exact=FAILED&dead_lettered=no&q=charge/"]
    pages = [LIST + query for query in queries]
    for job in jobs:
        pages += [reverse("admin:celery_idem_job_change", args=[job.pk]),
                  reverse("admin:celery_idem_job_history", args=[job.pk])]
    lease = Lease.objects.create(name="beat", holder="host/1", token=1,
                                 expires_at=timezone.now() + timedelta(minutes=1))
    pages += [reverse("admin:index"), reverse("admin:app_list", args=["celery_idem"]),
              reverse("admin:celery_idem_lease_changelist"),
              reverse("admin:celery_idem_lease_change", args=[lease.pk])]
    return pages


def test_loading_every_admin_page_writes_nothing_and_publishes_nothing(admin_client,
                                                                        monkeypatch):
    populate()
    # A lost message past the dispatch timeout: what a recovery pass would send again.
    make_job("lost/1", State.PENDING, age=timedelta(days=2))
    published: list[Any] = []
    real = Producer.publish
    monkeypatch.setattr(Producer, "publish",
                        lambda self, *a, **kw: published.append(a) or real(self, *a, **kw))
    pages = every_page(list(Job.objects.all()))
    before = snapshot()
    for url in pages:
        response = admin_client.get(url)
        assert response.status_code == 200, (url, response.status_code)
    assert snapshot() == before
    assert published == []
