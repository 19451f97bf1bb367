"""An operator in the job admin, for the tests of its actions (test_admin_permissions.py
and one file per action: retry, release, resolve, forget): logged in with the chosen
permissions, posting an action to the changelist, with the jobs sent again captured.

The fixtures are imported by name into each test module (``import x as x``), where
pytest finds them."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages

from celery_idem import actions
from celery_idem.models import Job, Transition

LIST = "/admin/celery_idem/job/"


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
