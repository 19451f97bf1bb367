"""A publish that finds its key already SUCCEEDED: answered at publish, with no message,
when nothing would see the message's run.

Sent, such a message only makes its worker replay the stored result (``runner``): into
the result backend under the new task id, and on to the callbacks, chain or chord it
carries. When its result is not stored (the task or the call ignores results, or the app
has no result backend) and it carries none of those, that replay changes nothing anyone
can read, so the producer does not send it: the intent's one statement and no message,
where a sent duplicate costs a message, a delivery and a claim that reads the row. The
publish is announced as the ``duplicate`` move, as the worker's replay would be (the
``transition`` signal, the duplicates counter).

Still sent: a FAILED or EXPIRED key's message (its replay raises, which Celery reports),
a message in a group, every message under broker durability (no row is read at publish),
an ``app.send_task`` by name (its publish hook cannot hold a message back) and every
re-send. Given up: the worker-side signals, events and hooks (``task_success``,
a task's ``on_success``) of a run that would only have replayed.
"""

from __future__ import annotations

from typing import Any

from celery.backends.base import DisabledBackend

from .backends import ClaimOutcome, Intent, get_backend
from .conf import settings
from .states import State

#: The body's embedded canvas that a replay passes the stored result on to (Celery's
#: protocol 2; errbacks do not fire on a success).
_CANVAS = ("callbacks", "chain", "chord")
#: The ``duplicate`` announcement's reason for a publish answered without its message.
ANSWERED_REASON = "finished: answered at publish, no message sent"


def seen(task: Any, body: Any, headers: dict[str, Any]) -> bool:
    """Whether anything but the job row would see this message's run: its result stored
    for the caller, a canvas it carries, a group it belongs to."""
    if headers.get("group") is not None:
        return True
    embed = body[2] if isinstance(body, (list, tuple)) and len(body) > 2 else None
    if any((embed or {}).get(name) for name in _CANVAS):
        return True
    return _result_stored(task, headers)


def _result_stored(task: Any, headers: dict[str, Any]) -> bool:
    if isinstance(task.backend, DisabledBackend):
        return False
    # Celery 5.7's worker obeys the header (Task.apply_async sets it from the task's own
    # unless the call says), 5.5's ignores the result when either says so: stored unless
    # the header says ignored, or is absent and the task does, on both.
    ignored = headers.get("ignore_result")
    return not (task.ignore_result if ignored is None else ignored)


def answer(outcome: ClaimOutcome, intent: Intent, task: Any, body: Any,
           kwargs: dict[str, Any], task_id: str) -> bool:
    """Whether this publish is answered by its key's stored success, and its message not
    to be sent (announced as a duplicate); False: send it. ``outcome`` is a publish's
    whose arguments matched the row's (its caller refused a mismatch already)."""
    row = outcome.row
    if (outcome.won or row is None or row.state is not State.SUCCEEDED
            or seen(task, body, kwargs.get("headers") or {})):
        return False
    get_backend(settings.DATABASE).replayed(row, intent, task_id, ANSWERED_REASON)
    return True
