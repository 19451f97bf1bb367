"""The job admin's operator actions, each behind its own permission; a viewer only reads."""

from __future__ import annotations

import pytest
from django.urls import reverse

from celery_idem.states import State
from tests.browser.jobs import make_job
from tests.db.admin_operator import LIST, history, state
from tests.db.admin_operator import act as act
from tests.db.admin_operator import login as login
from tests.db.admin_operator import sent as sent

pytestmark = pytest.mark.django_db

OPERATOR_PERMISSIONS = ["retry_job", "release_job", "resolve_job", "forget_job"]


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

