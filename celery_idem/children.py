"""Keys of messages sent on a job's behalf: one rule for every message a worker sends
while it runs an idempotent task, whoever publishes it (the body, Celery's tracer, the
result backend, ``chord_unlock``). ``celery_idem.producer`` asks it for the key of a
``PER_CALL`` message sent without one, and for the parent link."""

from __future__ import annotations

import hashlib
from typing import Any

from celery import current_app

from .fingerprints import canonical_json, fingerprint

#: Header of a message whose key was derived: what it was derived from (child_key).
BASE_HEADER = "celery_idem_base"
#: Celery's task that publishes a chord body where the result backend cannot.
CHORD_UNLOCK = "celery.chord_unlock"


def header(request: Any, name: str) -> Any:
    """A custom header of the message ``request`` runs: a worker puts custom headers on
    the request itself, eager mode nests them under ``headers``."""
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


def running_parent() -> Any:
    """The idempotent task whose claimed body is running in this worker process, if any."""
    task = publishing_task()
    if task is not None and getattr(task.request, "_idem_claim", None) is not None:
        return task
    return None


def publishing_task() -> Any:
    """The idempotent task this worker process is running, claimed or replayed: whatever
    Celery publishes now (a body's children, the chain's next step, a link callback, a
    chord body from the result backend) is sent on its behalf."""
    task = current_app.current_worker_task
    if task is None:
        return None
    request = task.request
    if getattr(request, "idempotency_key", None) is not None or header(request, BASE_HEADER):
        return task  # an idempotent task, or Celery's chord_unlock sent by one
    return None


def child_key(parent: Any, child_name: str, args: Any, kwargs: Any,
              options: dict[str, Any]) -> tuple[str, str]:
    """The key of a ``PER_CALL`` message sent without one while ``parent`` runs, and the
    base it derives from: the one rule for every message sent on a job's behalf.

    The base is the parent's key, except for the parent's chord body (published by the
    result backend from whichever header member finished last): there it is what the
    header members derived their keys from (``BASE_HEADER``), else the group's id, so
    every member derives the same body key. Where the result backend has no chord
    support of its own, Celery's ``chord_unlock`` task publishes the body: the publish
    hook gave it the key of the task that sent it as its ``BASE_HEADER``. A group member
    adds its position, so equal members of one group are separate jobs. Every part is
    stable across re-runs and replays of the parent, so a message sent again is a
    duplicate.
    """
    request = parent.request
    base = getattr(request, "idempotency_key", None)
    if base is None or _is_chord_body(request, options):
        base = header(request, BASE_HEADER) or f"group:{request.group}"
    arguments = fingerprint([list(args or ()), dict(kwargs or {})])
    parts = [getattr(parent, "namespace", parent.name), base, child_name, arguments]
    if options.get("group_index") is not None:
        parts.append(options["group_index"])
    return "child-" + hashlib.sha256(canonical_json(parts).encode()).hexdigest(), base


def _is_chord_body(request: Any, options: dict[str, Any]) -> bool:
    chord = request.chord
    body_id = (chord.get("options") or {}).get("task_id") if isinstance(chord, dict) else None
    return body_id is not None and body_id == options.get("task_id")
