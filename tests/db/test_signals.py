"""Observability: every transition sends the Django signal and a structured log line,
after its transaction commits, with the job, the move and the reason."""

from __future__ import annotations

import logging

import pytest
from django.db import transaction
from freezegun import freeze_time

from celery_idem import claims, signals
from celery_idem.producer import write_intent
from celery_idem.recovery import sweep as reaper
from django_app.effects.tasks import ship_order

pytestmark = pytest.mark.django_db(transaction=True)

FIELDS = {"job_id", "event", "from_state", "to_state", "attempt", "worker", "task_id",
          "reason", "actor", "task_name", "clock"}


@pytest.fixture
def received():
    """Every transition signal sent during the test, as a dict of its fields."""
    seen: list[dict] = []

    def receiver(sender, **kwargs):
        seen.append({k: kwargs[k] for k in FIELDS})

    signals.transition.connect(receiver, dispatch_uid="test-received")
    yield seen
    signals.transition.disconnect(dispatch_uid="test-received")


def claimed(n=1, lease=60):
    intent = ship_order.intent((n,), {})
    write_intent(intent, f"pub-{n}")
    return claims.acquire(intent, worker="h/1", task_id=f"t-{n}", lease_seconds=lease,
                          using="default")[1]


def test_every_transition_sends_the_signal_with_its_fields(received, backend):
    """publish, claim and commit each send one signal naming job, move and states."""
    claimed().succeed(1)
    assert [(s["event"], s["from_state"], s["to_state"], s["attempt"]) for s in received] == [
        ("published", None, "PENDING", 0), ("claimed", "PENDING", "RUNNING", 1),
        ("succeeded", "RUNNING", "SUCCEEDED", 1)]
    assert len({s["job_id"] for s in received}) == 1
    assert {s["task_name"] for s in received} == {ship_order.name}
    # When each write was made, in order (the metrics' claim-to-commit latency).
    clocks = [s["clock"] for s in received]
    assert clocks == sorted(clocks)


def test_recovery_transitions_carry_their_reason(received, backend, monkeypatch):
    """The reaper's release is announced with the stale-claim reason."""
    monkeypatch.setattr(reaper, "get_backend", lambda alias: backend)
    monkeypatch.setattr(reaper, "redispatch", lambda job, countdown=None, task_id=None: task_id)
    with freeze_time("2030-01-01 12:00"):
        claimed()
    with freeze_time("2030-01-01 13:00"):
        reaper.reap()
    released = received[-1]
    assert (released["event"], released["to_state"]) == ("released", "PENDING")
    assert released["reason"].startswith("stale claim") and released["worker"] == "h/1"
    assert released["attempt"] == 1, "a transition without an attempt guard reports the row's"
    assert released["task_name"] == ship_order.name, "recovery names the job's task"


def test_a_rolled_back_transition_sends_nothing(received, backend):
    """Inside a transaction that rolls back, the claim is never reported."""
    with pytest.raises(RuntimeError), transaction.atomic():
        claimed()
        assert received == []  # not before the commit either
        raise RuntimeError("roll back")
    assert received == []


def test_the_log_line_has_structured_fields(caplog, backend):
    """The celery_idem.transitions logger writes one INFO line with the fields as extra."""
    with caplog.at_level(logging.INFO, logger="celery_idem.transitions"):
        claimed()
    record = [r for r in caplog.records if r.name == "celery_idem.transitions"][-1]
    assert (record.action, record.event, record.to_state, record.attempt) == \
        ("claimed", "claimed", "RUNNING", 1)
    assert FIELDS <= set(vars(record))


def test_an_operator_move_reports_its_actor_and_attempt(received, backend):
    """An operator's release is announced with who did it and which attempt it fenced."""
    from django.utils import timezone

    from celery_idem.backends import Change
    from celery_idem.states import State

    claim = claimed()
    assert backend.apply(Change(claim.job_id, "released", State.RUNNING, attempt=1,
                                actor="alice"), timezone.now())
    assert (received[-1]["event"], received[-1]["attempt"], received[-1]["actor"]) == \
        ("released", 1, "alice")
