"""A job row edited by hand into a state the library never writes (docs/explanation/reliability.md,
"Bad inputs"): the database refuses what its constraints forbid; every other edit is
either run once or left for an operator, never run twice."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DataError, IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from celery_idem import actions
from celery_idem.errors import StoredFailure
from celery_idem.models import Job
from celery_idem.producer import KEY_HEADER, write_intent
from celery_idem.recovery import sweep
from django_app.effects.models import Effect
from django_app.effects.tasks import ship_order

pytestmark = pytest.mark.django_db(transaction=True)

LONG_AGO = timezone.now() - timedelta(days=1)


def edited(order_id: int, **values) -> Job:
    """The intent of ship_order(order_id), written as the producer writes it (no message
    sent), then edited by hand to ``values``."""
    write_intent(ship_order.intent((order_id,)), f"t-{order_id}")
    Job.objects.filter(key=f"ship/{order_id}").update(**values)
    return Job.objects.get(key=f"ship/{order_id}")


def deliver(order_id: int):
    """A message of ship_order(order_id) run in this process, as a worker runs it."""
    return ship_order.apply((order_id,), headers={KEY_HEADER: f"ship/{order_id}"})


def runs(order_id: int) -> int:
    return Effect.objects.filter(key=f"ship/{order_id}").count()


def reap_far_ahead() -> sweep.Report:
    """A recovery pass a day ahead: past every lease and dispatch timeout."""
    return sweep.reap(now=timezone.now() + timedelta(days=1))


@pytest.mark.parametrize("values", [
    pytest.param({"state": "DONE"}, id="unknown-state"),
    pytest.param({"state": "running"}, id="lower-case-state"),
    pytest.param({"attempt": -1}, id="negative-attempt"),
    pytest.param({"dispatch_count": -1}, id="negative-dispatch-count"),
])
def test_the_database_refuses_an_edit_its_constraints_forbid(backend, values):
    """state is checked against the states the code knows (byte for byte, on MySQL
    too: celery_idem/schema.py), counters are unsigned: the edit fails with
    IntegrityError (MySQL in strict mode: DataError, out of range) and the row is as it
    was."""
    write_intent(ship_order.intent((1,)), "t-1")
    with pytest.raises((IntegrityError, DataError)), transaction.atomic():
        Job.objects.filter(key="ship/1").update(**values)
    job = Job.objects.get(key="ship/1")
    assert (job.state, job.attempt, job.dispatch_count) == ("PENDING", 0, 0)


def test_succeeded_with_attempt_zero_replays_its_result_and_never_runs(backend):
    edited(2, state="SUCCEEDED", attempt=0, result={"shipped": 2}, finished_at=LONG_AGO)
    assert deliver(2).get() == {"shipped": 2}
    assert reap_far_ahead().as_dict() == {}
    assert runs(2) == 0 and Job.objects.get(key="ship/2").state == "SUCCEEDED"


def test_pending_with_a_finished_time_runs_once_like_any_pending_job(backend):
    edited(3, finished_at=LONG_AGO)
    assert deliver(3).get() == {"shipped": 3, "attempt": 1}
    assert deliver(3).get() == {"shipped": 3, "attempt": 1}
    job = Job.objects.get(key="ship/3")
    assert (job.state, runs(3)) == ("SUCCEEDED", 1) and job.finished_at > LONG_AGO


def test_running_with_attempt_zero_and_an_old_lease_is_taken_over_once(backend):
    edited(4, state="RUNNING", attempt=0, worker="gone@host:1", lease_expires_at=LONG_AGO)
    assert deliver(4).get() == {"shipped": 4, "attempt": 1}
    assert deliver(4).get() == {"shipped": 4, "attempt": 1}
    assert runs(4) == 1


def test_running_with_no_lease_waits_for_an_operator_and_then_runs_once(backend):
    """RUNNING with no lease is how a claim handed to its replacement looks: nothing
    takes it over (not a duplicate, not recovery); an operator's release sends it back,
    and it then runs once."""
    job = edited(5, state="RUNNING", attempt=1, worker="gone@host:1", lease_expires_at=None)
    duplicate = deliver(5)  # eager: the in-progress wait raises instead of re-queuing
    assert duplicate.failed() and "holds the claim" in str(duplicate.result)
    assert reap_far_ahead().as_dict() == {}
    assert Job.objects.get(key="ship/5").state == "RUNNING" and runs(5) == 0
    assert actions.release(job, actor="op", dispatch=False).done
    assert deliver(5).get() == {"shipped": 5, "attempt": 2}
    assert deliver(5).get() == {"shipped": 5, "attempt": 2}
    assert runs(5) == 1


def test_failed_with_no_error_replays_a_failure_and_an_operator_retry_runs_it(backend):
    job = edited(6, state="FAILED", attempt=1, error=None, finished_at=LONG_AGO)
    replay = deliver(6)
    assert replay.failed() and isinstance(replay.result, StoredFailure)
    assert runs(6) == 0
    assert actions.retry(job, actor="op", dispatch=False).done
    assert deliver(6).get() == {"shipped": 6, "attempt": 2}
    assert runs(6) == 1


def test_the_admin_shows_every_edited_row(backend, admin_client):
    """The list and each job's page render the edited rows as they are."""
    jobs = [
        edited(11, state="SUCCEEDED", attempt=0, result={"shipped": 11}),
        edited(12, finished_at=LONG_AGO),
        edited(13, state="RUNNING", attempt=0, worker="gone@host:1", lease_expires_at=LONG_AGO),
        edited(14, state="RUNNING", attempt=1, worker="gone@host:1", lease_expires_at=None),
        edited(15, state="FAILED", attempt=1, error=None, finished_at=LONG_AGO),
    ]
    listing = admin_client.get(reverse("admin:celery_idem_job_changelist"))
    assert listing.status_code == 200
    assert all(job.key in listing.content.decode() for job in jobs)
    for job in jobs:
        page = admin_client.get(reverse("admin:celery_idem_job_change", args=[job.pk]))
        assert page.status_code == 200, job.key
