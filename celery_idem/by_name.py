"""``app.send_task(name, ...)``: messages that bypass ``IdempotentTask.apply_async``.

- ``install`` wraps the project's app's ``send_task`` at Django start (``apps.ready``):
  it takes ``idempotency_key=`` (put in the ``celery_idem_key`` header, which a caller may
  also set itself), and raises MissingKey at the call when a ``PER_CALL`` task registered
  in this process is sent without a key outside a job, as ``delay()`` would.
- ``on_before_task_publish`` (Celery's ``before_task_publish`` signal, every message):
  a ``send_task`` message of an idempotent task registered here gets its intent written
  (unless ``durability.writes_intent`` says no) and its key, as ``apply_async`` would.
  Celery's signal dispatcher swallows a receiver's exceptions
  (``celery.utils.dispatch.signal.Signal.send``), so the hook cannot stop a bad message:
  it marks it (``ERROR_HEADER``) and the worker fails it with the same error without
  running it. A task not registered here has no signature to fingerprint with: a key
  given for it marks the message ``UNWRITTEN_HEADER`` and the worker writes the intent
  when it claims; without a key the worker raises MissingKey (late: the producer cannot
  know the task). A ``chord_unlock`` sent on a job's behalf gets the
  base of its chord body's key (``celery_idem.children``).
"""

from __future__ import annotations

import functools
import logging
from contextvars import ContextVar
from typing import Any

from celery import current_app

from . import errors, unsent
from .children import BASE_HEADER, CHORD_UNLOCK, header, publishing_task
from .conf import settings
from .durability import writes_intent
from .errors import IdempotencyError
from .keys import carry_key, missing_key
from .producer import (
    KEY_HEADER,
    SENDING,
    UNWRITTEN_HEADER,
    build_intent,
    derived_key,
    inserted_id,
    write_intent,
)

logger = logging.getLogger(__name__)

#: Header the publish hook sets when it could not accept a send_task message.
ERROR_HEADER = "celery_idem_error"
#: Set by ``checked_send_task`` while it sends: the intents its publish hook wrote (job id
#: if inserted, task id), for the rule of a send that fails after its intent.
_WRITTEN: ContextVar[list[tuple[int | None, str]] | None] = ContextVar(
    "celery_idem_send_task_written", default=None)


def install(app: Any) -> None:
    """Wrap ``app.send_task`` (once) with ``checked_send_task``."""
    if not getattr(app.send_task, "celery_idem", False):
        app.send_task = functools.partial(checked_send_task, app, app.send_task)
        app.send_task.celery_idem = True


def checked_send_task(app: Any, send_task: Any, name: str, args: Any = None,
                      kwargs: Any = None, *more: Any, idempotency_key: str | None = None,
                      **options: Any) -> Any:
    """``app.send_task`` with ``idempotency_key=``; MissingKey at the call for a
    ``PER_CALL`` task registered here, sent without a key outside a job."""
    if SENDING.get():  # IdempotentTask.apply_async, through Celery's: already keyed
        return send_task(name, args, kwargs, *more, **options)
    carry_key(options, idempotency_key)
    headers = options.get("headers") or {}
    task = app.tasks.get(name)
    spec = task.key_spec() if hasattr(task, "key_spec") else None
    if (spec is not None and spec.per_call and KEY_HEADER not in headers
            and publishing_task() is None):
        raise missing_key(name)
    written: list[tuple[int | None, str]] = []
    token = _WRITTEN.set(written)
    try:
        return send_task(name, args, kwargs, *more, **options)
    except Exception as exc:
        # The publish hook wrote an intent, then the message did not leave: the rule of
        # every publish (unsent.after_publish_error), accepted or raised, never both.
        job_id, task_id = written[-1] if written else (None, "")
        if not unsent.after_publish_error(settings.DATABASE, job_id, exc, app, name):
            raise
        return app.AsyncResult(task_id)
    finally:
        _WRITTEN.reset(token)


def on_before_task_publish(sender: str | None = None, headers: dict[str, Any] | None = None,
                           body: Any = None, **_: Any) -> None:
    """Give a ``send_task`` message its key and intent (see the module's docstring)."""
    if headers is None or SENDING.get():
        return  # apply_async did the work
    name = headers.get("task") or sender or ""
    if name == CHORD_UNLOCK:
        running = publishing_task()
        if running is not None:
            headers[BASE_HEADER] = running.request.idempotency_key
        return
    task = current_app.tasks.get(name)
    key_spec = getattr(task, "key_spec", None)
    if task is None or key_spec is None:
        if KEY_HEADER in headers:
            headers[UNWRITTEN_HEADER] = True
        return  # not an idempotent task here
    args, kwargs = (body[0], body[1]) if isinstance(body, list | tuple) else ((), {})
    try:
        spec = key_spec()
        key = headers.get(KEY_HEADER)
        if key is None:
            options = {"task_id": headers.get("id"), "group_index": headers.get("group_index")}
            key = derived_key(spec, task.name, args, kwargs, options, headers)
        job = build_intent(spec, task.namespace, task.name, args, kwargs, key)
        if writes_intent():
            outcome = write_intent(job, headers.get("id", ""))
            sending = _WRITTEN.get()
            if sending is not None:
                sending.append((inserted_id(outcome), headers.get("id", "")))
        else:  # broker durability: the worker's claim inserts the row
            headers[UNWRITTEN_HEADER] = True
    except (IdempotencyError, TypeError) as exc:
        logger.error("refused send_task(%r): %s", task.name, exc,
                     extra={"action": "publish_refused"})
        headers[ERROR_HEADER] = {"type": type(exc).__name__, "message": str(exc)}
        return
    headers[KEY_HEADER] = job.key


def refused_error(request: Any) -> IdempotencyError | None:
    """The error the publish hook marked this message with, rebuilt, if any."""
    refused = header(request, ERROR_HEADER)
    if not refused:
        return None
    cls = getattr(errors, str(refused.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, IdempotencyError)):
        cls = IdempotencyError
    return cls(refused.get("message") or None)
