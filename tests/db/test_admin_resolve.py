"""The job admin's resolve action: an UNCERTAIN job marked succeeded with a note, or
retried instead."""

from __future__ import annotations

import pytest

from celery_idem.models import Job
from celery_idem.states import State
from tests.browser.jobs import make_job
from tests.db.admin_operator import act as act
from tests.db.admin_operator import login as login
from tests.db.admin_operator import messages, state
from tests.db.admin_operator import sent as sent

pytestmark = pytest.mark.django_db


class TestResolve:
    def test_mark_succeeded_needs_a_note(self, login, act):
        """Without a note the page comes back with an error and nothing changes."""
        job = make_job("mail/1", State.UNCERTAIN)
        response = act(login("resolve_job"), "resolve_selected", job, post="yes",
                       decision="succeeded", note=" ")
        assert response.status_code == 200
        assert "the note is required" in response.content.decode()
        assert state(job) == State.UNCERTAIN

    def test_mark_succeeded_with_a_note(self, login, act):
        """UNCERTAIN -> SUCCEEDED, written as 'resolved' by the user, the note as reason."""
        job = make_job("mail/1", State.UNCERTAIN)
        client = login("resolve_job")
        page = act(client, "resolve_selected", job)
        assert "Mark succeeded" in page.content.decode()
        assert 'value="retry"' not in page.content.decode()  # no retry_job permission
        response = act(client, "resolve_selected", job, post="yes", decision="succeeded",
                       seen=f"{job.pk}:1", note="receipt is in the mail server's sent log")
        job.refresh_from_db()
        assert job.state == State.SUCCEEDED and job.finished_at is not None
        resolved = job.transitions.last()
        assert (resolved.event, resolved.from_state, resolved.actor) == (
            "resolved", "UNCERTAIN", "op")
        assert resolved.reason.endswith("receipt is in the mail server's sent log")
        assert messages(response) == ["1 uncertain job was marked succeeded: mail/1."]

    def test_retry_instead_needs_the_retry_permission_too(self, login, act, sent):
        job = make_job("mail/1", State.UNCERTAIN)
        data = {"post": "yes", "decision": "retry", "note": "not in the sent log"}
        assert act(login("resolve_job"), "resolve_selected", job, **data).status_code == 403
        assert state(job) == State.UNCERTAIN and not sent

    def test_retry_instead(self, login, act, sent):
        """The operator found no effect: the job is reset and sent again."""
        job = make_job("mail/1", State.UNCERTAIN)
        other = make_job("f/1", State.FAILED)
        response = act(login("resolve_job", "retry_job"), "resolve_selected", job, other,
                       post="yes", decision="retry", note="not in the sent log")
        assert state(job) == State.PENDING and state(other) == State.FAILED
        reset = Job.objects.get(pk=job.pk).transitions.last()
        assert reset.event == "reset" and "not in the sent log" in reset.reason
        assert [j.pk for j in sent] == [job.pk]
        assert "1 job was not resolved because it is not uncertain: f/1." in messages(response)
