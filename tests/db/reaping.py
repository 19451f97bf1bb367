"""The recovery pass against the database, with the clock moved by freezegun: what its
tests share (test_reaper_stale_claims.py, test_reaper_lost_messages.py,
test_reaper_passes.py). The fixtures are imported by name into each test module
(``import x as x``), where pytest finds them; ``timeouts`` applies to every test there."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from django.test import override_settings
from freezegun import freeze_time

from celery_idem import claims
from celery_idem.models import Transition
from celery_idem.producer import write_intent
from celery_idem.recovery import sweep as reaper
from django_app.effects.tasks import ship_order

LEASE = 60
TIMEOUT = 600  # CELERY_IDEM_DISPATCH_TIMEOUT in these tests
T0 = "2030-01-01 12:00:00"


@pytest.fixture(autouse=True)
def timeouts():
    with override_settings(CELERY_IDEM_DISPATCH_TIMEOUT=TIMEOUT,
                           CELERY_IDEM_DISPATCH_MAX_BACKOFF=4 * TIMEOUT):
        yield


@pytest.fixture
def sent(monkeypatch):
    """Every message the reaper sends, as (job key, task id), instead of the broker."""
    messages: list[tuple[str, str]] = []
    lock = threading.Lock()

    def fake(job, countdown=None, task_id=None):
        with lock:
            messages.append((job.key, task_id))
        return task_id

    monkeypatch.setattr(reaper, "redispatch", fake)
    return messages


def publish(task=ship_order, n=1, options=None):
    intent = dataclasses.replace(task.intent((n,), {}), options=options or {})
    write_intent(intent, f"pub-{intent.key}")
    return intent


def claim(intent, task_id="t-1", worker="host/1", lease=LEASE):
    _, won = claims.acquire(intent, worker=worker, task_id=task_id, lease_seconds=lease,
                            using="default")
    assert won is not None
    return won


def last(key, event):
    return Transition.objects.filter(job__key=key, event=event).order_by("-id").first()


def reap_at(when, **kwargs):
    with freeze_time(when):
        return reaper.reap(**kwargs)
