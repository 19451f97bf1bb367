"""The recovery pass and lost messages: a PENDING intent nobody claimed within the
dispatch timeout is sent again, with a backoff, and a failed send is tried again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from freezegun import freeze_time

from celery_idem.models import Job
from celery_idem.recovery import due
from celery_idem.recovery import sweep as reaper
from django_app.effects.tasks import ship_order
from tests.db.reaping import T0, claim, last, publish, reap_at
from tests.db.reaping import sent as sent
from tests.db.reaping import timeouts as timeouts

pytestmark = pytest.mark.django_db(transaction=True)


class TestLostMessages:
    def test_pending_past_the_dispatch_timeout_is_sent_again(self, backend, sent):
        """A PENDING intent nobody claimed within the timeout: re-dispatched and counted."""
        with freeze_time(T0):
            publish()
        assert reap_at("2030-01-01 12:09:59").as_dict() == {}
        report = reap_at("2030-01-01 12:10:01")
        job = Job.objects.get(key="ship/1")
        assert report.as_dict() == {"redispatched": {ship_order.name: 1}}
        assert (job.state, job.dispatch_count) == ("PENDING", 1)
        assert sent == [("ship/1", job.task_id)]
        assert "presumed lost" in last("ship/1", "redispatched").reason

    def test_redispatches_back_off(self, backend, sent):
        """The wait doubles with each re-dispatch: 600 s, then 1200 s, then 2400 s."""
        with freeze_time(T0):
            publish()
        reap_at("2030-01-01 12:10:01")
        assert reap_at("2030-01-01 12:20:02").as_dict() == {}  # 600 s after: too early
        assert reap_at("2030-01-01 12:30:02").total("redispatched") == 1  # 1200 s after
        assert reap_at("2030-01-01 13:00:01").as_dict() == {}  # 1799 s after
        assert reap_at("2030-01-01 13:10:03").total("redispatched") == 1  # 2400 s after
        assert Job.objects.get(key="ship/1").dispatch_count == 3 and len(sent) == 3

    def test_backoff_is_capped(self):
        """The wait never exceeds CELERY_IDEM_DISPATCH_MAX_BACKOFF."""
        assert [due.redispatch_wait(n) for n in range(5)] == [600, 1200, 2400, 2400, 2400]

    def test_a_scheduled_retry_is_not_sent_before_its_not_before(self, backend, sent):
        """A retry due in an hour gets the full timeout after its ETA, not after its write."""
        with freeze_time(T0):
            intent = publish()
            held = claim(intent)
            held.schedule_retry(timezone.now() + timedelta(hours=1), "retry: later")
        assert reap_at("2030-01-01 12:30:00").as_dict() == {}
        assert reap_at("2030-01-01 13:09:59").as_dict() == {}
        assert reap_at("2030-01-01 13:10:01").total("redispatched") == 1

    def test_claimed_jobs_are_not_sent_again(self, backend, sent):
        """A job claimed meanwhile is RUNNING under a live lease: nothing to do."""
        with freeze_time(T0):
            intent = publish()
        with freeze_time("2030-01-01 12:30:00"):
            claim(intent, lease=3600)
        assert reap_at("2030-01-01 12:31:00").as_dict() == {} and sent == []

    def test_a_failed_send_is_retried_by_the_next_pass(self, backend, monkeypatch):
        """The broker refuses: reported, the job stays PENDING and its row says never
        sent (the broker answers, so the re-dispatch is counted), a later pass sends it."""
        with freeze_time(T0):
            publish()

        def refuse(job, countdown=None, task_id=None):
            raise ConnectionError("broker down")

        monkeypatch.setattr(reaper, "redispatch", refuse)
        report = reap_at("2030-01-01 12:10:01")
        assert report.total("send_failed") == 1 and report.total("redispatched") == 1
        job = Job.objects.get()
        assert (job.state, job.sent_at, job.dispatch_count) == ("PENDING", None, 1)
        calls = []
        monkeypatch.setattr(reaper, "redispatch",
                            lambda job, countdown=None, task_id=None: calls.append(task_id))
        assert reap_at("2030-01-01 12:40:02").total("redispatched") == 1 and len(calls) == 1

    def test_jobs_without_stored_arguments_are_skipped(self, backend, sent):
        """STORE_ARGUMENTS off: the message cannot be rebuilt, so the pass reports it."""
        with freeze_time(T0):
            publish()
        Job.objects.filter(key="ship/1").update(args=None, kwargs=None)
        assert reap_at("2030-01-01 13:00:00").as_dict() == {"skipped": {ship_order.name: 1}}
        assert sent == []

    def test_finished_jobs_are_never_touched(self, backend, sent):
        """SUCCEEDED and FAILED rows are outside both sweeps."""
        with freeze_time(T0):
            claim(publish(n=1)).succeed(1)
            claim(publish(n=2)).fail(ValueError("no"))
        assert reap_at("2031-01-01").as_dict() == {} and sent == []

