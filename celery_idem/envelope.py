"""The envelope: the message a job was published with, kept on its row as JSON.

``IdempotentTask.apply_async`` hands Celery a producer wrapped in ``Capture``; when
Celery publishes, the wrapper sees the finished message (protocol 2 body with its
embedded callbacks, errbacks, chain and chord; every header Celery set: ETA, expires,
retries, time limits, group / root / parent ids, the user's headers; the routing and
the AMQP properties) and passes it to the producer path, which writes it with the intent
in the same statement, lean (format 2, ``lean_envelope``: only what the row does not hold
and a re-send cannot rebuild). A retry's message, kept by the claim it replaces, and
rows written before format 2 are full envelopes (format 1). A re-send
(``recovery.resend``) publishes that message again under the task id recovery gives it,
so it behaves as the original would: the ETA and the expiry hold, links and chords fire,
the retry count continues.

Values are stored as kombu's JSON encoder writes them (datetimes and the like become
``{"__type__": ...}`` objects) and decoded by kombu on the way back: JSON only.
With ``CELERY_IDEM_STORE_ARGUMENTS = False`` the body (arguments, and the callbacks'
arguments with it) and the argument reprs are dropped: such a message cannot be sent
again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery.backends.rpc import RPCBackend
from kombu.utils import json as kombu_json

from . import lean_envelope as lean
from .backends.values import Intent
from .conf import settings

#: publish() keywords that are not AMQP properties of the message.
_PUBLISH_KEYWORDS = frozenset({
    "exchange", "routing_key", "serializer", "compression", "retry", "retry_policy",
    "delivery_mode", "declare", "headers", "timeout", "confirm_timeout",
})
#: Headers that repeat the arguments (for monitoring): dropped with the arguments.
_ARGUMENT_HEADERS = ("argsrepr", "kwargsrepr")
#: Celery's own headers that are often None: stored only when set, and put back as None
#: on re-send, so the message sent again is the one published. The intent writes the
#: envelope (most of a job row) to the WAL once; these and the correlation id, which a
#: re-send replaces anyway, were about 170 of its ~990 bytes
#: (docs/decisions/2026-11-23-lean-row.md).
_NULL_HEADERS = ("eta", "expires", "group", "group_index", "parent_id", "root_id", "shadow",
                 "stamped_headers")

Publish = Callable[[Any, Any, dict[str, Any]], Any]


class Capture:
    """A kombu producer whose ``publish`` goes through ``on_publish(real, body, kwargs)``
    first; everything else is the real producer's."""

    def __init__(self, real: Any, on_publish: Publish) -> None:
        self._real = real
        self._on_publish = on_publish

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def publish(self, body: Any, **kwargs: Any) -> Any:
        return self._on_publish(self._real, body, kwargs)


#: Types whose values are their own plain JSON (exact types: a subclass, an enum say,
#: may encode otherwise).
_SELF_PLAIN = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any) -> Any:
    """``value`` as plain JSON, in kombu's encoding (its decoder restores the types)."""
    if type(value) in _SELF_PLAIN:
        return value  # what the round trip would give back: spare it
    return json.loads(kombu_json.dumps(value))


def _name(value: Any) -> Any:
    return getattr(value, "name", value)


def capture(body: Any, kwargs: dict[str, Any], row: Intent | None = None,
            app: Any = None, given: tuple[str, ...] = ()) -> dict[str, Any]:
    """The envelope of one ``producer.publish(body, **kwargs)`` call, as JSON.

    With ``row`` (the intent it is written with) the lean format: only what the row does
    not hold and a re-send cannot rebuild (``expand``). ``given``: the argument reprs the
    caller set itself (kept: they may hide a secret). ``app``: whose result backend says
    whether the reply-to queue matters (the RPC backend sends results there)."""
    headers = {name: value for name, value in (kwargs.get("headers") or {}).items()
               if value is not None or name not in _NULL_HEADERS}
    properties = {}
    for name, value in kwargs.items():
        if name in _PUBLISH_KEYWORDS or name == "correlation_id":
            continue  # the correlation id: a re-send sets its own (publish below)
        try:
            properties[name] = _plain(value)
        except (TypeError, ValueError):
            continue  # not part of what the broker carries in JSON; rebuilt on re-send
    stored_body: Any = list(body) if isinstance(body, list | tuple) else body
    if not settings.STORE_ARGUMENTS:
        stored_body = None
        for name in _ARGUMENT_HEADERS:
            headers.pop(name, None)
    if row is not None:
        return lean.capture(row, stored_body, headers, properties, kwargs,
                            given, _replies(app), _plain)
    # Body and headers in one round trip through the encoder (each raises alike).
    plain_body, plain_headers = _plain([stored_body, headers])
    return {
        "v": 1,
        "body": None if stored_body is None else plain_body,
        "headers": plain_headers,
        "properties": properties,
        "exchange": _name(kwargs.get("exchange")) or "",
        "routing_key": kwargs.get("routing_key") or "",
        "declare": [_name(q) for q in kwargs.get("declare") or () if _name(q)],
        "delivery_mode": kwargs.get("delivery_mode"),
        "serializer": kwargs.get("serializer"),
        "compression": kwargs.get("compression"),
    }


def _replies(app: Any) -> bool:
    """Whether results go to the caller's reply-to queue (the RPC result backend)."""
    return app is not None and isinstance(app.backend, RPCBackend)


def _when(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value)
    return None


def _header(envelope: dict[str, Any] | None, name: str) -> Any:
    """Header ``name`` of the stored envelope with kombu's types restored: only that
    value is decoded (what ``decode`` of the whole envelope would give for it)."""
    value = (envelope or {}).get("headers", {}).get(name)
    if type(value) in _SELF_PLAIN:
        return value  # the usual ISO string or None: nothing to decode
    return kombu_json.loads(json.dumps(value))


def eta(envelope: dict[str, Any] | None) -> datetime | None:
    """When the message is due (its ETA or countdown), if later than at once."""
    return _when(_header(envelope, "eta"))


def expires(envelope: dict[str, Any] | None) -> datetime | None:
    """When the message expires, if it does."""
    return _when(_header(envelope, "expires"))


def decode(envelope: dict[str, Any]) -> dict[str, Any]:
    """The stored envelope with kombu's types restored."""
    decoded: dict[str, Any] = kombu_json.loads(json.dumps(envelope))
    return decoded


class Undecodable(ValueError):
    """The stored envelope cannot be turned back into a message."""


def publish(app: Any, job: Any, task_id: str, fresh: bool = False) -> None:
    """Send ``job``'s stored message again under ``task_id``: same body, headers, routing
    (a lean envelope, format 2, completed from the row first: ``lean_envelope.expand``).
    ``fresh`` (an operator's retry): without its expiry, and with Celery's retry count
    back at 0, as the reset gives the job a fresh ``max_attempts`` budget."""
    stored = job.message
    try:
        if stored.get("v") == lean.VERSION:
            stored = lean.expand(app, stored, job, task_id)
        message = decode(stored)
        body = message["body"]
        headers = dict(message["headers"])
        properties = dict(message.get("properties") or {})
        if body is None:
            raise Undecodable("the message's arguments were not stored")
        body = tuple(body)
    except (KeyError, TypeError, ValueError) as exc:
        raise Undecodable(f"stored message cannot be decoded: {exc}") from exc
    for name in _NULL_HEADERS:
        headers.setdefault(name, None)
    headers["id"] = task_id
    properties["correlation_id"] = task_id
    if fresh:
        headers["expires"] = None
        headers["retries"] = 0
        properties.pop("expiration", None)
    queues = app.amqp.queues
    declare = [queues[name] for name in message.get("declare") or ()]
    with app.producer_or_acquire() as producer:
        producer.publish(
            body, exchange=message.get("exchange") or "",
            routing_key=message.get("routing_key") or "",
            serializer=message.get("serializer") or app.conf.task_serializer,
            compression=message.get("compression"),
            delivery_mode=message.get("delivery_mode"), declare=declare, headers=headers,
            retry=True, retry_policy=app.conf.task_publish_retry_policy, **properties)
