"""A LeaderTask tick run through Celery's tracer (eager, in this process): the body runs
on the holder with its fencing token; a tick meeting another holder's lease is skipped,
logged and counted; an expired holder is replaced."""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import pytest
from django.utils import timezone

from celery_idem import LeaderTask, leases
from celery_idem.errors import LeaseLost
from celery_idem.leader import OVERRUN_ACTION, SKIP_ACTION
from celery_idem.models import Lease
from django_app.celery import app

pytestmark = pytest.mark.django_db
SEEN: list[dict] = []


@app.task(base=LeaderTask, bind=True, shard="tenant/{tenant_id}", lease=30,
          name="tests.leader_tick", shared=False)
def leader_tick(self, tenant_id, renew=False):
    if renew:
        self.renew_lease(60)
    self.check_lease()
    SEEN.append({"name": self.lease_name, "token": self.fencing_token})
    return self.fencing_token


@pytest.fixture(autouse=True)
def _seen():
    SEEN.clear()


def test_the_first_tick_takes_the_lease_and_later_ticks_keep_it():
    assert leader_tick.apply((1,)).get() == 1
    assert leader_tick.apply((1,)).get() == 1  # renewed, same token
    assert SEEN == [{"name": "tenant/1", "token": 1}] * 2
    lease = Lease.objects.get(name="tenant/1")
    assert lease.holder.endswith(f"/{os.getpid()}") and lease.skipped_ticks == 0
    assert leader_tick.apply((2,)).get() == 1  # another shard, its own lease


def test_a_tick_meeting_another_holder_is_skipped_logged_and_counted(caplog):
    leases.acquire("tenant/1", "other-worker/1", 30)
    with caplog.at_level(logging.INFO, logger="celery_idem.leader"):
        assert leader_tick.apply((1,)).get() is None
    assert SEEN == []
    lease = Lease.objects.get(name="tenant/1")
    assert (lease.holder, lease.skipped_ticks) == ("other-worker/1", 1)
    assert lease.last_skipped_at is not None
    [record] = [r for r in caplog.records if getattr(r, "action", None) == SKIP_ACTION]
    assert record.lease == "tenant/1" and record.task == "tests.leader_tick"


def test_an_expired_holder_is_replaced_with_a_greater_token(monkeypatch):
    leases.acquire("tenant/1", "dead-worker/1", 30)
    later = timezone.now() + timedelta(seconds=31)
    monkeypatch.setattr(timezone, "now", lambda: later)
    assert leader_tick.apply((1,)).get() == 2
    assert Lease.objects.get(name="tenant/1").holder.endswith(f"/{os.getpid()}")


def test_the_body_renews_and_its_fencing_check_fails_once_the_shard_is_taken():
    assert leader_tick.apply((1,), {"renew": True}).get() == 1
    assert Lease.objects.get(name="tenant/1").expires_at > timezone.now() + timedelta(seconds=55)

    @app.task(base=LeaderTask, bind=True, shard="tenant/{tenant_id}", lease=30,
              name="tests.leader_tick_taken", shared=False)
    def taken_mid_body(self, tenant_id):
        # Another holder takes the shard while this body runs (its lease ran out).
        Lease.objects.filter(name="tenant/1").update(token=self.fencing_token + 1,
                                                     holder="successor/1")
        self.check_lease()

    with pytest.raises(LeaseLost, match="fenced out"):
        taken_mid_body.apply((1,)).get()


def test_a_body_that_outlives_its_lease_is_logged(monkeypatch, caplog):
    @app.task(base=LeaderTask, bind=True, shard="tenant/{tenant_id}", lease=30,
              name="tests.leader_tick_slow", shared=False)
    def slow(self, tenant_id):
        later = timezone.now() + timedelta(seconds=31)
        monkeypatch.setattr(timezone, "now", lambda: later)  # the body ran 31 s
        return self.fencing_token

    with caplog.at_level(logging.WARNING, logger="celery_idem.leader"):
        assert slow.apply((1,)).get() == 1
    [record] = [r for r in caplog.records if getattr(r, "action", None) == OVERRUN_ACTION]
    assert record.lease == "tenant/1"
