"""The job admin's forget action: the job deleted with its history and checkpoints,
and who forgot it kept in the admin log and the logger."""

from __future__ import annotations

import logging

import pytest
from django.contrib.admin.models import DELETION, LogEntry

from celery_idem.models import Checkpoint, Job, Transition
from celery_idem.states import State
from tests.browser.jobs import make_job, populate
from tests.db.admin_operator import LIST, messages, state
from tests.db.admin_operator import act as act
from tests.db.admin_operator import login as login

pytestmark = pytest.mark.django_db



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
