"""The lean envelope (format 2): what a publish stores, and that the re-send rebuilds the
message the producer published (links, chains, chord members, retries, the caller's
headers), from the row; rows in the full format (1) still re-send."""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any

import pytest
from celery import chain, chord, current_app, group

from celery_idem import envelope, lean_envelope, producer
from celery_idem.models import Job
from celery_idem.recovery.resend import redispatch, task_id_for
from django_app.effects.tasks import add, collect, notify, ship_order

pytestmark = pytest.mark.django_db(transaction=True)

#: Headers a re-send sets from the re-sending node (``origin``) and AMQP properties only
#: the RPC result backend reads (``reply_to``): the only differences allowed.
NODE_HEADERS = ("origin",)


@pytest.fixture
def published(monkeypatch):
    """Each publish's (body, publish keywords, intent, stored envelope), as captured."""
    seen: list[tuple[Any, dict[str, Any], Any, dict[str, Any]]] = []
    real = envelope.capture

    def recording(body, kwargs, row=None, app=None, given=()):
        stored = real(body, kwargs, row, app, given)
        seen.append((body, dict(kwargs), row, stored))
        return stored

    monkeypatch.setattr(producer.envelope, "capture", recording)
    return seen


class Recorder:
    def __init__(self) -> None:
        self.published: list[tuple[Any, dict[str, Any]]] = []

    def publish(self, body, **kwargs):
        self.published.append((body, kwargs))


def record(monkeypatch) -> Recorder:
    """From now on, what the process publishes is recorded instead of sent."""
    recorder = Recorder()

    @contextmanager
    def acquire(producer=None):
        yield recorder

    monkeypatch.setattr(current_app, "producer_or_acquire", acquire)
    return recorder


@pytest.fixture
def recorder(monkeypatch):
    return record(monkeypatch)


def comparable(body: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A publish as the broker carries it, in JSON, without what a re-send may change."""
    headers = {k: v for k, v in (kwargs.get("headers") or {}).items()
               if k not in NODE_HEADERS}
    properties = {k: v for k, v in kwargs.items() if v is not None
                  and k not in ("headers", "producer", "retry", "retry_policy", "declare",
                               "reply_to", "correlation_id")}
    properties["declare"] = [getattr(q, "name", q) for q in kwargs.get("declare") or ()]
    properties["exchange"] = getattr(properties.get("exchange"), "name",
                                     properties.get("exchange")) or ""
    properties.setdefault("compression", None)
    return json.loads(json.dumps({"body": list(body), "headers": headers,
                                  "properties": properties}, default=str))


def sends(published, recorder) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """For each keyed publish: the message published and its re-send from the row."""
    pairs = []
    for body, kwargs, row, stored in published:
        job = Job.objects.get(namespace=row.namespace, key=row.key)
        assert job.message == stored and stored["v"] == lean_envelope.VERSION
        task_id = task_id_for(job)
        assert task_id == kwargs["headers"]["id"]  # the message's own id, from the row
        redispatch(job, task_id=task_id)
        sent_body, sent = recorder.published.pop()
        pairs.append((comparable(body, kwargs), comparable(sent_body, sent)))
    return pairs


def test_a_plain_publish_stores_almost_nothing(published):
    """Task, id, arguments, reprs, key header, queue and Celery's defaults are the row's
    or rebuilt: a plain call stores the format and the queue it went to."""
    ship_order.apply_async((1,), queue="orders")
    ship_order.delay(2)
    stored = [p[3] for p in published]
    assert stored[0] == {"v": 2}
    assert stored[1] == {"v": 2, "routing_key": current_app.conf.task_default_queue}


@pytest.mark.parametrize("call", [
    "plain", "link_and_errback", "countdown_expiry_priority_headers", "chain_step",
    "chain_with_options", "chord_header_member", "group_member", "custom_argsrepr",
    "time_limits_and_ignore_result", "kwargs",
])
def test_a_re_send_publishes_the_message_the_producer_published(published, monkeypatch,
                                                                 call):
    """Each shape of publish, re-sent from its row: the same body (canvas included),
    headers (but the node's origin) and routing as the producer published."""
    calls = {
        "plain": lambda: ship_order.delay(10),
        "link_and_errback": lambda: ship_order.apply_async(
            (11,), link=notify.si(11, "linked"), link_error=notify.si(11, "errback")),
        "countdown_expiry_priority_headers": lambda: ship_order.apply_async(
            (12,), countdown=30, expires=600, priority=4, headers={"x_user": "u-1"},
            queue="orders"),
        "chain_step": lambda: chain(ship_order.si(13), add.si(13, 1)).apply_async(),
        "chain_with_options": lambda: chain(add.si(14, 0), ship_order.si(14).set(
            queue="orders"), add.si(14, 2)).apply_async(),
        "chord_header_member": lambda: chord([ship_order.si(15), ship_order.si(16)])(
            collect.s("c")),
        "group_member": lambda: group(ship_order.si(17), ship_order.si(18)).apply_async(),
        "custom_argsrepr": lambda: ship_order.apply_async((19,), argsrepr="(secret,)"),
        "time_limits_and_ignore_result": lambda: ship_order.apply_async(
            (20,), time_limit=30, soft_time_limit=20, ignore_result=True),
        "kwargs": lambda: add.apply_async(kwargs={"x": 21, "y": 2}),
    }
    calls[call]()  # to the test broker
    assert published, "no keyed publish captured"
    for original, resent in sends(published, record(monkeypatch)):
        assert resent == original


def test_a_row_in_the_full_format_still_re_sends(recorder):
    """A row written before format 2 (a full envelope, format 1): sent as stored."""
    body = ([7], {}, {"callbacks": [{"task": "t.link"}], "errbacks": None, "chain": None,
                      "chord": None})
    full = envelope.capture(body, {
        "exchange": "", "routing_key": "orders", "priority": 5, "correlation_id": "t-0",
        "headers": {"id": "t-0", "task": ship_order.name, "retries": 2, "lang": "py",
                    "argsrepr": "(7,)", "origin": "old@host", "celery_idem_key": "ship/7"}})
    assert full["v"] == 1 and full["body"][0] == [7]
    job = Job.objects.create(namespace="ns", key="ship/7", task_name=ship_order.name,
                             args=[7], kwargs={}, fingerprint="f", message=full,
                             task_id="t-0")
    assert task_id_for(job) == "t-0"
    redispatch(job, task_id="t-0")
    (sent_body, sent), = recorder.published
    assert list(sent_body) == [[7], {}, body[2]]
    assert (sent["headers"]["origin"], sent["headers"]["retries"], sent["routing_key"]) == \
        ("old@host", 2, "orders")


def test_a_retry_count_and_a_changed_argument_list_are_kept(recorder):
    """What the row cannot rebuild is stored: a retry count, arguments other than the
    row's (a retry's), an exchange; and re-sent as such."""
    intent = ship_order.intent((30,), {})
    body = ([31], {"extra": 1}, {"callbacks": None, "errbacks": None, "chain": None,
                                 "chord": None})
    kept = envelope.capture(body, {
        "exchange": "orders-x", "routing_key": "orders", "declare": [],
        "delivery_mode": 2, "headers": {"id": "t-9", "task": ship_order.name, "retries": 3,
                                        "lang": "py", "celery_idem_key": intent.key}},
        intent)
    assert kept == {"v": 2, "headers": {"retries": 3}, "args": [31],
                    "kwargs": {"extra": 1}, "exchange": "orders-x",
                    "routing_key": "orders", "declare": []}
    job = Job.objects.create(namespace=intent.namespace, key=intent.key,
                             task_name=ship_order.name, args=[30], kwargs={},
                             fingerprint=intent.fingerprint, message=kept, task_id="t-9")
    redispatch(job, task_id="t-9")
    (sent_body, sent), = recorder.published
    assert list(sent_body[:2]) == [[31], {"extra": 1}]
    assert (sent["headers"]["retries"], sent["exchange"], sent["routing_key"]) == \
        (3, "orders-x", "orders")
    assert (sent["headers"]["id"], sent["headers"]["root_id"]) == ("t-9", "t-9")
