"""The recovery pass and the kept message: scheduled work, expiry, never-sent intents,
undeliverable jobs (issue 13), with the clock moved by freezegun and messages captured
instead of sent."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings
from freezegun import freeze_time

from celery_idem import envelope
from celery_idem.errors import Expired, StoredFailure
from celery_idem.models import Job, Transition
from celery_idem.producer import mark_sent, write_intent
from celery_idem.recovery import sweep as reaper
from django_app.effects.tasks import ship_order

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 600
T0 = "2030-01-01 12:00:00"


@pytest.fixture(autouse=True)
def timeouts():
    with override_settings(CELERY_IDEM_DISPATCH_TIMEOUT=TIMEOUT,
                           CELERY_IDEM_DISPATCH_MAX_BACKOFF=TIMEOUT,
                           CELERY_IDEM_NEVER_SENT_TIMEOUT=30,
                           CELERY_IDEM_MAX_REDISPATCHES=2):
        yield


@pytest.fixture
def sent(monkeypatch):
    messages: list[tuple[str, str]] = []

    def fake(job, countdown=None, task_id=None, fresh=False):
        messages.append((job.key, task_id))
        return task_id

    monkeypatch.setattr(reaper, "redispatch", fake)
    return messages


def at(when: str) -> datetime:
    return datetime.fromisoformat(when + "+00:00")


def publish(n=1, **fields):
    intent = dataclasses.replace(ship_order.intent((n,), {}), **fields)
    with freeze_time(T0):
        write_intent(intent, f"pub-{n}")
    return Job.objects.get(key=intent.key)


def reap_at(when):
    with freeze_time(when):
        return reaper.reap()


def test_a_job_is_not_due_before_its_eta(backend, sent):
    """ETA an hour out: passes past the dispatch timeout but before the ETA send nothing;
    only the ETA plus the timeout presumes the message lost."""
    publish(not_before=at("2030-01-01 13:00:00"))
    assert reap_at("2030-01-01 12:20:00").as_dict() == {}
    assert reap_at("2030-01-01 13:09:00").as_dict() == {}
    assert sent == []
    assert reap_at("2030-01-01 13:10:01").as_dict() == {"redispatched": {ship_order.name: 1}}


def test_an_expired_message_ends_expired_and_is_never_sent_again(backend, sent):
    """expires passed with no claim: EXPIRED with the error a duplicate gets; no re-send."""
    publish(expires_at=at("2030-01-01 12:05:00"))
    assert reap_at("2030-01-01 12:30:00").as_dict() == {"expired": {ship_order.name: 1}}
    job = Job.objects.get(key="ship/1")
    assert job.state == "EXPIRED" and job.error["type"] == "Expired"
    assert isinstance(Expired.from_record(job.error), StoredFailure)
    assert reap_at("2030-01-02 12:00:00").as_dict() == {} and sent == []


def test_a_never_sent_intent_is_sent_after_its_own_short_timeout(backend, sent):
    """Written in a transaction, its producer died before the send: sent after 30 s (not
    the 600 s dispatch timeout), and marked sent."""
    publish(sent=False)
    assert reap_at("2030-01-01 12:00:20").as_dict() == {}
    assert reap_at("2030-01-01 12:00:31").as_dict() == {"redispatched": {ship_order.name: 1}}
    job = Job.objects.get(key="ship/1")
    assert job.sent_at is not None and sent == [("ship/1", job.task_id)]


def test_a_sent_intent_is_marked_and_waits_for_the_dispatch_timeout(backend, sent):
    """The outbox's send marks the row; then only the dispatch timeout applies."""
    job = publish(sent=False)
    with freeze_time(T0):
        mark_sent(job.id)
    assert Job.objects.get(id=job.id).sent_at is not None
    assert reap_at("2030-01-01 12:05:00").as_dict() == {} and sent == []


def test_a_job_never_claimed_ends_undeliverable_after_bounded_re_sends(backend, sent):
    """No worker runs its task: two re-sends, then FAILED with the reason; never again."""
    publish()
    clock = at(T0)
    actions = []
    for _ in range(5):
        clock += timedelta(seconds=TIMEOUT + 1)
        actions.append(reaper.reap(now=clock).as_dict())
    assert actions[:3] == [{"redispatched": {ship_order.name: 1}}] * 2 + \
        [{"undeliverable": {ship_order.name: 1}}]
    assert actions[3:] == [{}, {}] and len(sent) == 2
    job = Job.objects.get(key="ship/1")
    assert job.state == "FAILED" and job.error["type"] == "Undeliverable"
    assert "never claimed" in job.error["message"]


def test_an_undecodable_message_ends_undeliverable(backend):
    """A stored message that cannot be turned back into one: FAILED at the first re-send."""
    publish(message={"v": 1, "headers": {}})
    report = reaper.reap(now=at(T0) + timedelta(seconds=TIMEOUT + 1))
    assert report.as_dict() == {"redispatched": {ship_order.name: 1},
                                "undeliverable": {ship_order.name: 1}}
    job = Job.objects.get(key="ship/1")
    assert job.state == "FAILED" and "cannot be decoded" in job.error["message"]
    assert list(Transition.objects.filter(job=job).values_list("event", flat=True)) == \
        ["redispatched", "dead_lettered"]


def test_the_envelope_keeps_eta_expiry_links_and_drops_arguments_when_told():
    """What capture keeps of a Celery publish, as JSON; without argument storage, no body
    and no argument reprs."""
    body = ([1], {"a": 2}, {"callbacks": [{"task": "t.link"}], "errbacks": None,
                            "chain": None, "chord": None})
    kwargs = {"exchange": "", "routing_key": "q1", "headers": {
        "id": "abc", "eta": "2030-01-01T13:00:00+00:00", "expires": None, "retries": 1,
        "argsrepr": "[1]", "kwargsrepr": "{'a': 2}"}, "priority": 3,
        "correlation_id": "abc", "declare": [], "retry_policy": {"max_retries": 3}}
    kept = envelope.capture(body, kwargs)
    assert kept["body"][2]["callbacks"] == [{"task": "t.link"}]
    # No correlation id (a re-send sets its own) and no Celery header that is None.
    assert kept["properties"] == {"priority": 3}
    assert kept["headers"]["retries"] == 1 and kept["routing_key"] == "q1"
    assert "expires" not in kept["headers"]
    assert envelope.eta(kept) == at("2030-01-01 13:00:00")
    with override_settings(CELERY_IDEM_STORE_ARGUMENTS=False):
        bare = envelope.capture(body, kwargs)
    assert bare["body"] is None and "argsrepr" not in bare["headers"]


class Recorder:
    """A producer that records what would be published."""

    def __init__(self) -> None:
        self.published: list[tuple[Any, dict[str, Any]]] = []

    def publish(self, body, **kwargs):
        self.published.append((body, kwargs))


@pytest.mark.parametrize("fresh", [False, True], ids=["recovery", "operator"])
def test_a_re_send_publishes_the_kept_message(monkeypatch, fresh):
    """Body (with its callbacks), headers and routing as kept; a new task id; an operator's
    retry drops the expiry and restarts Celery's retry count."""
    from contextlib import contextmanager

    from celery import current_app

    from celery_idem.recovery.resend import redispatch

    recorder = Recorder()

    @contextmanager
    def acquire(producer=None):
        yield recorder

    monkeypatch.setattr(current_app, "producer_or_acquire", acquire)
    body = ([7], {}, {"callbacks": [{"task": "t.link"}], "errbacks": None, "chain": None,
                      "chord": None})
    kept = envelope.capture(body, {
        "exchange": "", "routing_key": "orders", "priority": 5, "correlation_id": "t-0",
        "headers": {"id": "t-0", "task": ship_order.name, "retries": 2, "eta": None,
                    "group": None, "shadow": None, "x_user": None,
                    "expires": "2030-01-01T12:00:00+00:00", "celery_idem_key": "ship/7"}})
    job = Job(namespace="ns", key="ship/7", task_name=ship_order.name, args=[7], kwargs={},
              message=kept)
    assert redispatch(job, task_id="t-1", fresh=fresh) == "t-1"
    (sent_body, sent), = recorder.published
    assert sent_body == tuple(body[:2]) + (body[2],)
    assert (sent["routing_key"], sent["priority"], sent["correlation_id"]) == \
        ("orders", 5, "t-1")
    headers = sent["headers"]
    assert (headers["id"], headers["celery_idem_key"]) == ("t-1", "ship/7")
    assert (headers["retries"], headers["expires"] is None) == ((0, True) if fresh
                                                                else (2, False))
    # Celery's headers that were None (not stored) go out as None again; a header of the
    # caller's that was None was stored as such.
    assert "eta" not in kept["headers"] and kept["headers"]["x_user"] is None
    assert (headers["eta"], headers["group"], headers["shadow"], headers["x_user"]) == \
        (None, None, None, None)
