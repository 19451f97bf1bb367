"""The producer side: write the PENDING intent before a message leaves, and the publish hook.

``IdempotentTask.apply_async`` covers ``delay``, ``apply_async``, signatures, chains and
groups, and raises bad input before anything is sent. ``app.send_task("name")`` bypasses
``apply_async``; the ``before_task_publish`` hook covers it when the task class is known
to the producer. Celery's signal dispatcher swallows a receiver's exceptions
(``celery.utils.dispatch.signal.Signal.send``), so the hook cannot stop such a message:
it marks it instead, and the worker fails it with the same error without running it.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from celery import current_app
from django.utils import timezone

from .backends import Intent, get_backend
from .claims import persistence
from .conf import settings
from .errors import IdempotencyError, KeyMismatch
from .fingerprints import canonical_json, fingerprint

logger = logging.getLogger(__name__)

#: Header the publish hook sets when it could not accept a send_task message.
ERROR_HEADER = "celery_idem_error"
#: apply_async options that decide where a message goes, kept to re-dispatch it.
ROUTING_OPTIONS = ("queue", "routing_key", "exchange", "priority")


def write_intent(intent: Intent, task_id: str) -> None:
    """Insert the PENDING intent, or find the key; raise KeyMismatch on other arguments."""
    with persistence():
        outcome = get_backend(settings.DATABASE).publish(intent, task_id, timezone.now())
    row = outcome.row
    if not outcome.won and row is not None and row.fingerprint != intent.fingerprint:
        raise KeyMismatch.build(intent.namespace, intent.key, row.fingerprint, intent.fingerprint)


def delivery_options(options: dict[str, Any]) -> dict[str, Any]:
    """The routing part of apply_async options, as JSON (a kombu Queue becomes its name)."""
    kept = {}
    for name in ROUTING_OPTIONS:
        value = options.get(name)
        if value is not None:
            kept[name] = getattr(value, "name", value)
    return kept


def current_claimed_task() -> Any:
    """The idempotent task whose body is running in this worker process, if any."""
    task = current_app.current_worker_task
    if task is not None and getattr(task.request, "_idem_claim", None) is not None:
        return task
    return None


def child_key(parent: Any, child_name: str, args: Any, kwargs: Any) -> str:
    """A key for a child sent without one: stable across re-runs of the parent."""
    parts = [parent.namespace, parent.request.idempotency_key, child_name,
             fingerprint([list(args or ()), dict(kwargs or {})])]
    return "child-" + hashlib.sha256(canonical_json(parts).encode()).hexdigest()


def refused_error(request: Any) -> IdempotencyError | None:
    """The error the publish hook marked this message with, rebuilt, if any."""
    from . import errors

    refused = getattr(request, ERROR_HEADER, None) or \
        (getattr(request, "headers", None) or {}).get(ERROR_HEADER)
    if not refused:
        return None
    cls = getattr(errors, str(refused.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, IdempotencyError)):
        cls = IdempotencyError
    return cls(refused.get("message") or None)


def on_before_task_publish(sender: str | None = None, headers: dict[str, Any] | None = None,
                           body: Any = None, **_: Any) -> None:
    """Give a ``send_task`` message of a known idempotent task its key and intent."""
    from .task import HEADER, IdempotentTask

    if headers is None or HEADER in headers:
        return  # apply_async already did the work
    task = current_app.tasks.get(headers.get("task") or sender or "")
    if not isinstance(task, IdempotentTask):
        return
    args, kwargs = (body[0], body[1]) if isinstance(body, list | tuple) else ((), {})
    try:
        intent = task.intent(args, kwargs)
        write_intent(intent, headers.get("id", ""))
    except (IdempotencyError, TypeError) as exc:
        logger.error("refused send_task(%r): %s", task.name, exc,
                     extra={"action": "publish_refused"})
        headers[ERROR_HEADER] = {"type": type(exc).__name__, "message": str(exc)}
        return
    headers[HEADER] = intent.key
