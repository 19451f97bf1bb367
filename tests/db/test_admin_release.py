"""The job admin's release action: a claim handed back after confirmation, by the
attempt the operator saw."""

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


class TestRelease:
    def test_asks_for_confirmation_first(self, login, act, sent):
        """The first POST shows the confirmation page, with the claim's worker and lease."""
        job = make_job("k", State.RUNNING, worker="celery@w-9")
        response = act(login("release_job"), "release_selected", job)
        assert response.status_code == 200
        assert response.templates[0].name == "admin/celery_idem/job/release_confirmation.html"
        html = response.content.decode()
        assert "celery@w-9" in html and "live claim" in html
        assert f'name="seen" value="{job.pk}:1"' in html
        assert state(job) == State.RUNNING and not sent

    def test_confirmed_release_moves_to_pending_with_the_actor_and_sends(self, login, act, sent):
        """RUNNING -> PENDING, written as 'released' by the user with the note."""
        job = make_job("k", State.RUNNING, stale=True)
        response = act(login("release_job"), "release_selected", job, post="yes",
                       seen=f"{job.pk}:1", dispatch="on", note="worker host rebooted")
        job.refresh_from_db()
        assert job.state == State.PENDING and job.lease_expires_at is None
        released = job.transitions.last()
        assert (released.event, released.actor) == ("released", "op")
        assert released.reason == "released by an operator: worker host rebooted"
        assert len(sent) == 1
        assert messages(response) == [
            "1 claim was released; the job is pending again and was sent to its queue: k."]

    def test_without_sending_leaves_it_to_the_reaper(self, login, act, sent):
        job = make_job("k", State.RUNNING)
        response = act(login("release_job"), "release_selected", job, post="yes",
                       seen=f"{job.pk}:1")
        assert state(job) == State.PENDING and not sent
        assert "the reaper will send it" in messages(response)[0]

    def test_a_newer_claim_than_the_confirmed_one_is_not_released(self, login, act, sent):
        """Confirmed for attempt 1; attempt 2 took over meanwhile: nothing is released."""
        job = make_job("k", State.RUNNING)
        Job.objects.filter(pk=job.pk).update(attempt=2)
        response = act(login("release_job"), "release_selected", job, post="yes",
                       seen=f"{job.pk}:1", dispatch="on")
        assert state(job) == State.RUNNING and not sent
        assert "changed while you acted" in messages(response)[0]

    def test_a_job_that_is_not_running_is_left_alone(self, login, act, sent):
        job = make_job("k", State.SUCCEEDED)
        client = login("release_job")
        page = act(client, "release_selected", job)
        assert "there is no claim to release" in page.content.decode()
        response = act(client, "release_selected", job, post="yes", seen=f"{job.pk}:1")
        assert messages(response) == ["1 job was not released because it is not running: k."]
        assert state(job) == State.SUCCEEDED

