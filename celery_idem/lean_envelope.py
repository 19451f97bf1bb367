"""The lean envelope (format 2): only what the job row does not hold and a re-send
cannot rebuild.

A fresh task's intent was ~1,790 bytes of WAL, the stored message ~816 of them, most of
it a second copy of the row (task name, id, arguments, key header, queue) or Celery's
defaults (docs/decisions/2026-11-23-lean-row.md). Format 2 keeps:

- the headers that are not the row's and not Celery's defaults: the caller's own, the
  ETA and expiry, a non-zero retry count, time limits, ``ignore_result``, the canvas ids
  (``parent_id``, ``root_id`` when not the task's own id, ``group``, ``group_index``),
  ``shadow``, stamps, and the argument reprs when the caller set them (they may hide a
  secret); the producer's ``origin`` is not kept (a re-send is published from the
  re-sending node, and says so);
- the body's embedded canvas (``callbacks``, ``errbacks``, ``chain``, ``chord``) when set;
  the arguments only when they differ from the row's ``args``/``kwargs`` (never, for an
  intent: one copy, in the columns the admin and the mismatch check read);
- the AMQP properties that are set (priority, expiration, ...) but the reply-to queue,
  which only the RPC result backend reads (one that is None is left to kombu's default,
  which brokers read alike: not mandatory, not immediate, priority 0);
- the routing when it is not the row's queue (``options["queue"]``) on the default
  exchange, a non-persistent delivery mode, a serializer other than JSON, compression.

``expand`` turns it back into the full envelope (format 1) that ``envelope.publish``
sends, from the job row and the re-sending app: a worker gets the message the producer
published, but for ``origin``, and argument reprs rebuilt as Celery builds them.
"""

from __future__ import annotations

from typing import Any

from celery.utils.nodenames import anon_nodename
from celery.utils.saferepr import saferepr

from .backends.values import Intent
from .keys import KEY_HEADER

VERSION = 2
#: Headers as Celery sets them when the caller asked for nothing: not stored.
DEFAULT_HEADERS: dict[str, Any] = {
    "lang": "py", "retries": 0, "timelimit": [None, None], "ignore_result": False,
    "replaced_task_nesting": 0, "stamps": {},
}
#: The body's embedded canvas, in Celery's protocol 2.
EMBED = ("callbacks", "errbacks", "chain", "chord")
#: Headers rebuilt from the row (or the publishing node) on a re-send.
_ROW_HEADERS = frozenset({"task", "id", "origin", KEY_HEADER})
_REPRS = ("argsrepr", "kwargsrepr")


def capture(row: Intent, body: Any, headers: dict[str, Any], properties: dict[str, Any],
            kwargs: dict[str, Any], given: tuple[str, ...], replies: bool,
            plain: Any) -> dict[str, Any]:
    """The format 2 envelope of a message published for ``row`` (see the module)."""
    kept: dict[str, Any] = {"v": VERSION}
    task_id = headers.get("id")
    lean = {name: value for name, value in headers.items()
            if name not in _ROW_HEADERS
            and not (name in _REPRS and name not in given)
            and not (name == "root_id" and value == task_id)
            and not (name in DEFAULT_HEADERS and _same(value, DEFAULT_HEADERS[name]))}
    if lean:
        kept["headers"] = plain(lean)
    if body is not None:
        args, kw, embed = body
        if list(args) != row.args or kw != row.kwargs:
            kept["args"], kept["kwargs"] = plain([list(args), kw])
        canvas = {name: value for name, value in (embed or {}).items() if value is not None}
        if canvas:
            kept["embed"] = plain(canvas)
    properties = {name: value for name, value in properties.items()
                  if value is not None and (replies or name != "reply_to")}
    if properties:
        kept["properties"] = properties
    kept.update(_routing(row, kwargs))
    return kept


def _same(value: Any, default: Any) -> bool:
    # Celery's time limits are a list or a tuple depending on the path: compare as lists.
    return (list(value) if isinstance(value, tuple) else value) == default


def _name(value: Any) -> Any:
    return getattr(value, "name", value)


def _routing(row: Intent, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The routing fields that differ from the row's queue on the default exchange."""
    exchange = _name(kwargs.get("exchange")) or ""
    routing_key = kwargs.get("routing_key") or ""
    declare = [_name(q) for q in kwargs.get("declare") or () if _name(q)]
    kept: dict[str, Any] = {}
    if exchange:
        kept["exchange"] = exchange
    if routing_key != row.options.get("queue"):
        kept["routing_key"] = routing_key
    if declare != [routing_key]:
        kept["declare"] = declare
    if kwargs.get("delivery_mode") != 2:
        kept["delivery_mode"] = kwargs.get("delivery_mode")
    if (kwargs.get("serializer") or "json") != "json":
        kept["serializer"] = kwargs.get("serializer")
    if kwargs.get("compression"):
        kept["compression"] = kwargs.get("compression")
    return kept


def expand(app: Any, message: dict[str, Any], job: Any, task_id: str) -> dict[str, Any]:
    """The full envelope (format 1) of a format 2 one, from ``job``'s row: sent as
    ``task_id`` by ``app``."""
    args = message.get("args", job.args)
    kwargs = message.get("kwargs", job.kwargs)
    stored = message.get("headers") or {}
    headers = {**{name: _copy(value) for name, value in DEFAULT_HEADERS.items()},
               "task": job.task_name, "id": task_id, "root_id": task_id,
               "origin": anon_nodename(), KEY_HEADER: job.key}
    body = None
    if args is not None or kwargs is not None:
        args, kwargs = list(args or ()), dict(kwargs or {})
        headers["argsrepr"] = _repr(app, tuple(args), app.amqp.argsrepr_maxsize)
        headers["kwargsrepr"] = _repr(app, kwargs, app.amqp.kwargsrepr_maxsize)
        body = [args, kwargs, {**dict.fromkeys(EMBED), **(message.get("embed") or {})}]
    headers.update(stored)
    routing_key = message.get("routing_key", (job.options or {}).get("queue"))
    if routing_key is None:
        routing_key = app.conf.task_default_queue
    return {
        "v": 1, "body": body, "headers": headers,
        "properties": message.get("properties") or {},
        "exchange": message.get("exchange", ""), "routing_key": routing_key,
        "declare": message.get("declare", [routing_key]),
        "delivery_mode": message.get("delivery_mode", 2),
        "serializer": message.get("serializer", "json"),
        "compression": message.get("compression"),
    }


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else dict(value) \
        if isinstance(value, dict) else value


def _repr(app: Any, value: Any, size: int) -> str:
    """Celery's own argument repr (``app.amqp.as_task_v2``)."""
    levels = getattr(app.conf, "task_repr_maxlevels", None)
    return str(saferepr(value, size, **({"maxlevels": levels} if levels is not None else {})))
