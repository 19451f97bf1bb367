"""The job admin's operator actions: each behind its permission, each written to history."""

from __future__ import annotations

import logging

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.urls import reverse

from celery_idem import actions
from celery_idem.admin import operations
from celery_idem.models import Checkpoint, Job, Transition
from celery_idem.states import State
from tests.browser.jobs import make_job, populate

pytestmark = pytest.mark.django_db

LIST = "/admin/celery_idem/job/"
OPERATOR_PERMISSIONS = ["retry_job", "release_job", "resolve_job", "forget_job"]


@pytest.fixture
def login(client, django_user_model):
    """Log a staff user in with view_job and the given permissions; returns the client."""

    def login(*codenames: str):
        user = django_user_model.objects.create_user("op", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(codename__in=["view_job", *codenames]))
        client.force_login(user)
        return client

    return login


@pytest.fixture
def sent(monkeypatch):
    """The jobs sent again (instead of publishing to the broker), in order."""
    jobs: list[Job] = []

    def fake_redispatch(job, countdown=None, task_id=None, fresh=False):
        jobs.append(job)
        return task_id or f"task-{len(jobs)}"

    monkeypatch.setattr(actions, "redispatch", fake_redispatch)
    return jobs


@pytest.fixture
def act(django_capture_on_commit_callbacks):
    """POST an action on jobs to the changelist, running the after-commit sends."""

    def act(client, action, *jobs, **data):
        payload = {"action": action, "_selected_action": [j.pk for j in jobs], **data}
        with django_capture_on_commit_callbacks(execute=True):
            return client.post(LIST, payload)

    return act


def messages(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def history(job: Job) -> list[str]:
    return list(Transition.objects.filter(job=job).values_list("event", flat=True))


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


class TestPermissions:
    @pytest.mark.parametrize("action, job_state, data", [
        ("retry_selected", State.FAILED, {}),
        ("release_selected", State.RUNNING, {"post": "yes"}),
        ("resolve_selected", State.UNCERTAIN, {"post": "yes", "decision": "succeeded",
                                               "note": "checked"}),
        ("forget_selected", State.FAILED, {"post": "yes"}),
    ])
    def test_each_action_is_refused_without_its_own_permission(self, login, act, sent, action,
                                                               job_state, data):
        """Holding the other three permissions does not allow this action."""
        own = f"{action.removesuffix('_selected')}_job"
        client = login(*[p for p in OPERATOR_PERMISSIONS if p != own])
        job = make_job("k", job_state)
        before = history(job)
        assert action not in dict(client.get(LIST).context["action_form"].fields["action"].choices)
        assert act(client, action, job, **data).status_code == 403
        assert state(job) == job_state and history(job) == before and not sent

    def test_viewer_sees_everything_read_only(self, login):
        """Staff with only view_job get the list and the detail page, with no actions."""
        client = login()
        job = make_job("k", State.FAILED)
        response = client.get(LIST)
        assert response.status_code == 200
        assert response.context["action_form"] is None  # no action offered at all
        detail = client.get(reverse("admin:celery_idem_job_change", args=[job.pk]))
        assert detail.status_code == 200 and detail.context["job_actions"] == []


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
        """A broker error after the commit is a warning: the reaper sends PENDING jobs later.

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


class TestForget:
    def test_confirmation_page_lists_what_is_deleted(self, login, act):
        jobs = populate()
        response = act(login("forget_job"), "forget_selected", jobs["declined"])
        html = response.content.decode()
        assert "the job, 2 history rows, 1 checkpoint" in html
        assert Job.objects.filter(pk=jobs["declined"].pk).exists()

    def test_forget_deletes_the_job_its_history_and_checkpoints_and_logs_it(
            self, login, act, caplog):
        """The rows are gone, so the admin log and the logger keep who forgot what."""
        jobs = populate()
        job = jobs["declined"]
        with caplog.at_level(logging.INFO, logger="celery_idem.actions"):
            response = act(login("forget_job"), "forget_selected", job, post="yes",
                           seen=f"{job.pk}:2", note="customer asked to charge again")
        assert response["Location"] == LIST
        assert not Job.objects.filter(pk=job.pk).exists()
        assert not Transition.objects.filter(job_id=job.pk).exists()
        assert not Checkpoint.objects.filter(job_id=job.pk).exists()
        entry = LogEntry.objects.get()
        assert (entry.action_flag, entry.object_id, entry.user.username) == (
            DELETION, str(job.pk), "op")
        assert "deleted 1 checkpoint, 1 job, 2 transition." in entry.change_message
        assert "customer asked to charge again" in entry.change_message
        [record] = [r for r in caplog.records if getattr(r, "action", "") == "forgotten"]
        assert (record.key, record.actor) == ("charge/order-1044", "op")
        assert messages(response) == [
            "1 job was forgotten with its history; its key can run again: charge/order-1044."]

    def test_running_job_is_not_forgotten(self, login, act):
        job = make_job("k", State.RUNNING)
        response = act(login("forget_job"), "forget_selected", job, post="yes",
                       seen=f"{job.pk}:1")
        assert "release its claim first" in messages(response)[0]
        assert state(job) == State.RUNNING and not LogEntry.objects.exists()

    def test_a_job_that_moved_since_confirmation_is_kept(self, login, act):
        job = make_job("k", State.FAILED)
        response = act(login("forget_job"), "forget_selected", job, post="yes",
                       seen=f"{job.pk}:7")
        assert "changed while you acted" in messages(response)[0]
        assert Job.objects.filter(pk=job.pk).exists()
