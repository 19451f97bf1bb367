"""Send a stored job's message again: the envelope it was published with.

Used by recovery (stale claims, lost messages, never-sent intents) and by operators
(admin retry, idem_retry). A job published through ``apply_async`` kept its message
(``celery_idem.envelope``): that message is published again under a new task id, with
its ETA, expiry, retry count, links, chain and chord. A job without an envelope (written
before it was kept, or by ``send_task``'s hook) is rebuilt from its arguments and routing
through ``send_task`` by name; the sending process need not import the task either way.
"""

from __future__ import annotations

from typing import Any

from celery import current_app
from celery.utils import uuid

from .. import envelope, lean_envelope
from ..errors import ConfigurationError
from ..keys import KEY_HEADER


def task_id_for(job: Any) -> str:
    """The task id a re-send of ``job`` goes under: its message's own id when the envelope
    is kept or the message was never sent (results, chord counters and the caller's
    AsyncResult all wait on that id), else a new one. An expired message's id is revoked
    in the workers that dropped it, so an expired job goes under a new id."""
    message = getattr(job, "message", None) or {}
    if getattr(job, "state", None) == "EXPIRED":
        return uuid()
    original = (message.get("headers") or {}).get("id")
    never_sent = getattr(job, "sent_at", True) is None and getattr(job, "attempt", 1) == 0
    if message.get("v") == lean_envelope.VERSION or never_sent:
        # The row holds the message's id (a never-sent one's is the id its caller holds).
        original = getattr(job, "task_id", "")
    return str(original) if original else uuid()


def redispatch(job: Any, countdown: float | None = None, task_id: str | None = None,
               fresh: bool = False) -> str:
    """Publish ``job``'s task once more under a new task id, and return that id.

    ``job`` is a ``celery_idem.models.Job`` (or anything with its fields). The message
    carries the job's key, so it claims the same row instead of writing a new intent.
    ``task_id`` lets a caller record the id in the job before the message leaves
    (``task_id_for``). ``fresh``: an operator sends it again on purpose, so the message's
    expiry no longer holds.
    """
    if job.args is None and job.kwargs is None:
        raise ConfigurationError(
            f"job {job.namespace}:{job.key} has no stored arguments "
            "(CELERY_IDEM_STORE_ARGUMENTS is off), so it cannot be sent again"
        )
    task_id = task_id or uuid()
    if getattr(job, "message", None) and not countdown:
        envelope.publish(current_app, job, task_id, fresh=fresh)
        return task_id
    options: dict[str, Any] = dict(job.options or {})
    if countdown:
        options["countdown"] = countdown
    current_app.send_task(
        job.task_name, args=list(job.args or ()), kwargs=dict(job.kwargs or {}),
        task_id=task_id, headers={KEY_HEADER: job.key}, **options,
    )
    return task_id
