"""The job admin's retry action: reset, sent after the commit, each outcome reported."""

from __future__ import annotations

import pytest
from django.urls import reverse

from celery_idem import actions
from celery_idem.admin import operations
from celery_idem.models import Job
from celery_idem.states import State
from tests.browser.jobs import make_job
from tests.db.admin_operator import LIST, history, messages, state
from tests.db.admin_operator import act as act
from tests.db.admin_operator import login as login
from tests.db.admin_operator import sent as sent

pytestmark = pytest.mark.django_db


class TestRetry:
    def test_failed_job_is_reset_with_the_actor_and_sent_after_commit(self, login, act, sent):
        """FAILED -> PENDING, the error cleared, one dispatch, the history names the user."""
        job = make_job("charge/1", State.FAILED, attempts=2)
        response = act(login("retry_job"), "retry_selected", job)
        assert response.status_code == 302
        job.refresh_from_db()
        assert (job.state, job.error, job.finished_at, job.dispatch_count) == (
            State.PENDING, None, None, 1)
        reset = job.transitions.last()
        assert (reset.event, reset.from_state, reset.to_state, reset.actor, reset.attempt) == (
            "reset", "FAILED", "PENDING", "op", 2)
        assert "was CardDeclined: card declined" in reset.reason
        assert reset.task_id == job.task_id != ""  # the id of the message sent again
        assert [(j.pk, j.task_id) for j in sent] == [(job.pk, job.task_id)]
        assert messages(response) == [
            "1 job is pending again and was sent to its queue: charge/1."]

    def test_succeeded_job_is_refused_with_the_reason(self, login, act, sent):
        """A SUCCEEDED key is not run again: the message explains why (idempotence)."""
        job = make_job("charge/2", State.SUCCEEDED)
        response = act(login("retry_job"), "retry_selected", job)
        [text] = messages(response)
        assert text.startswith("1 job was not retried because it already succeeded: charge/2.")
        assert "idempotency key prevents" in text and "forget the job first" in text
        assert state(job) == State.SUCCEEDED and "reset" not in history(job) and not sent

    def test_uncertain_job_is_retried_and_mixed_selections_report_each_outcome(
            self, login, act, sent):
        """One message per outcome, each with its count and keys (ngettext plurals)."""
        jobs = [make_job("u/1", State.UNCERTAIN), make_job("f/1", State.FAILED),
                make_job("s/1", State.SUCCEEDED), make_job("r/1", State.RUNNING)]
        response = act(login("retry_job"), "retry_selected", *jobs)
        texts = messages(response)
        assert any(t.startswith("2 jobs are pending again and were sent to their queues: ")
                   for t in texts)
        assert any(t.startswith("1 job was not retried because it already succeeded")
                   for t in texts)
        assert "1 job was not retried because only failed or uncertain jobs can be: r/1." in texts
        assert [state(j) for j in jobs] == [State.PENDING, State.PENDING, State.SUCCEEDED,
                                           State.RUNNING]
        assert len(sent) == 2

    def test_job_without_stored_arguments_is_refused(self, login, act, sent):
        """Without stored arguments the task cannot be sent again, so nothing changes."""
        job = make_job("k", State.FAILED)
        Job.objects.filter(pk=job.pk).update(args=None, kwargs=None)
        [text] = messages(act(login("retry_job"), "retry_selected", job))
        assert "arguments are not stored" in text
        assert state(job) == State.FAILED and not sent

    @pytest.mark.django_db(transaction=True)
    def test_failed_send_is_reported_and_the_job_stays_pending(self, login, act, monkeypatch):
        """A broker error after the commit is a warning, and the row says never sent: the
        reaper sends it later.

        (Outside a test transaction, as in a request, the send runs at the commit, before
        the messages are written.)
        """
        def broken(job, countdown=None, task_id=None, fresh=False):
            raise ConnectionError("broker unreachable")

        monkeypatch.setattr(actions, "redispatch", broken)
        job = make_job("k", State.FAILED)
        texts = messages(act(login("retry_job"), "retry_selected", job))
        assert "1 job is pending but could not be sent (broker unreachable): k." in texts[1]
        assert state(job) == State.PENDING
        # The row does not say a message was sent: no sent time, the failure in its history.
        job.refresh_from_db()
        assert job.sent_at is None
        assert job.transitions.filter(event="send_failed").exists()

    def test_from_the_detail_page_returns_there(self, login, act, sent):
        """The detail page's button comes back to the job; a foreign next URL is ignored."""
        job = make_job("k", State.FAILED)
        page = reverse("admin:celery_idem_job_change", args=[job.pk])
        client = login("retry_job")
        assert act(client, "retry_selected", job, next=page)["Location"] == page
        other = make_job("k2", State.FAILED)
        response = act(client, "retry_selected", other, next="https://evil.example/")
        assert response["Location"] == LIST

    def test_a_race_is_reported_not_hidden(self, sent):
        """A job that moved since the operator looked is left alone and reported."""
        job = make_job("k", State.FAILED)
        seen = Job.objects.get(pk=job.pk)
        assert actions.retry(job, actor="a").done
        result = actions.retry(seen, actor="b")  # b still sees FAILED
        assert result.outcome is actions.Outcome.RACED
        assert history(job).count("reset") == 1

    def test_too_many_jobs_at_once(self, login, act, sent, monkeypatch):
        """One action takes a bounded number of jobs."""
        monkeypatch.setattr(operations, "MAX_ACTION_JOBS", 2)
        jobs = [make_job(f"k{n}", State.FAILED) for n in range(3)]
        assert messages(act(login("retry_job"), "retry_selected", *jobs)) == [
            "Select at most 2 jobs for this action."]
        assert not sent

