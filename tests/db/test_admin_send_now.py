"""The job admin's send-now action: a pending job's stored message sent again at once, by
the move recovery makes for a lost message, behind the retry permission."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from celery_idem import actions
from celery_idem.models import Job
from celery_idem.states import State
from tests.browser.jobs import make_job
from tests.db.admin_operator import LIST, history, messages, state
from tests.db.admin_operator import act as act
from tests.db.admin_operator import login as login
from tests.db.admin_operator import sent as sent

pytestmark = pytest.mark.django_db


class TestSendNow:
    def test_pending_job_is_sent_again_with_the_actor_after_commit(self, login, act, sent):
        """The 'redispatched' move by the user: one more re-send, the message's own task
        id, the send time; then the message leaves, once."""
        job = make_job("ship/1", State.PENDING)
        before = job.sent_at
        response = act(login("retry_job"), "send_now_selected", job)
        assert response.status_code == 302
        job.refresh_from_db()
        assert (job.state, job.dispatch_count, job.attempt) == (State.PENDING, 1, 0)
        assert job.sent_at is not None and before is not None and job.sent_at > before
        line = job.transitions.get()
        assert (line.event, line.from_state, line.to_state, line.actor, line.task_id) == (
            "redispatched", "PENDING", "PENDING", "op", job.task_id)
        assert line.reason == "sent again now by an operator"
        assert [(j.pk, j.task_id) for j in sent] == [(job.pk, job.task_id)]
        assert messages(response) == ["1 pending job was sent to its queue again: ship/1."]

    def test_a_never_sent_intent_is_sent(self, login, act, sent):
        """An intent whose message never left (no send time) is the case it is for."""
        job = make_job("ship/2", State.PENDING)
        Job.objects.filter(pk=job.pk).update(sent_at=None)
        act(login("retry_job"), "send_now_selected", job)
        job.refresh_from_db()
        assert job.sent_at is not None and job.dispatch_count == 1 and len(sent) == 1

    @pytest.mark.parametrize("job_state", [State.RUNNING, State.SUCCEEDED, State.FAILED,
                                           State.UNCERTAIN])
    def test_only_a_pending_job_is_sent(self, login, act, sent, job_state):
        job = make_job("k", job_state)
        before = history(job)
        response = act(login("retry_job"), "send_now_selected", job)
        assert messages(response) == [
            "1 job was not sent because only pending jobs can be: k."]
        assert state(job) == job_state and history(job) == before and not sent

    def test_a_job_whose_message_cannot_be_sent_again_is_refused(self, login, act, sent):
        """Without stored arguments, scheduled for later, or expired: nothing written, each
        told apart."""
        bare = make_job("bare", State.PENDING)
        Job.objects.filter(pk=bare.pk).update(args=None, kwargs=None)
        scheduled = make_job("later", State.PENDING,
                             retried=["ConnectionError: carrier API timed out"],
                             not_before=timezone.now() + timedelta(minutes=5))
        expired = make_job("gone", State.PENDING)
        Job.objects.filter(pk=expired.pk).update(
            expires_at=timezone.now() - timedelta(minutes=1))
        response = act(login("retry_job"), "send_now_selected", bare, scheduled, expired)
        assert sorted(messages(response)) == sorted([
            "1 job was not sent because its arguments are not stored "
            "(CELERY_IDEM_STORE_ARGUMENTS is off): bare.",
            "1 job was not sent because it waits for a retry scheduled for later; its "
            "message is due then: later.",
            "1 job was not sent because its message expired; recovery marks it expired, "
            "and Retry sends it again: gone.",
        ])
        assert not sent
        assert [Job.objects.get(pk=j.pk).dispatch_count for j in (bare, scheduled, expired)
                ] == [0, 0, 0]
        assert "redispatched" not in history(bare) + history(scheduled) + history(expired)

    def test_a_job_claimed_or_sent_since_it_was_read_is_left_alone(self, sent):
        """Fenced by the attempt and the re-send count as read: a claim or another send in
        between wins, and this one writes and sends nothing."""
        claimed, resent = make_job("a", State.PENDING), make_job("b", State.PENDING)
        Job.objects.filter(pk=claimed.pk).update(attempt=1)
        assert actions.send_now(Job.objects.get(pk=resent.pk), actor="x").done
        assert actions.send_now(claimed, actor="op").outcome is actions.Outcome.RACED
        assert actions.send_now(resent, actor="op").outcome is actions.Outcome.RACED
        assert Job.objects.get(pk=resent.pk).dispatch_count == 1
        assert history(claimed) == [] and history(resent) == ["redispatched"]

    def test_needs_the_retry_permission(self, login, act, sent):
        """Without retry_job the action is not offered and a crafted POST is refused."""
        client = login("release_job", "resolve_job", "forget_job")
        job = make_job("k", State.PENDING)
        choices = dict(client.get(LIST).context["action_form"].fields["action"].choices)
        assert "send_now_selected" not in choices
        assert act(client, "send_now_selected", job).status_code == 403
        assert history(job) == [] and not sent

    def test_the_detail_page_offers_it_for_a_pending_job_only(self, login):
        client = login("retry_job")
        page = reverse("admin:celery_idem_job_change", args=[make_job("p").pk])
        assert "send_now_selected" in [
            a["name"] for a in client.get(page).context["job_actions"]]
        page = reverse("admin:celery_idem_job_change", args=[make_job("f", State.FAILED).pk])
        assert "send_now_selected" not in [
            a["name"] for a in client.get(page).context["job_actions"]]
