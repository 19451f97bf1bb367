"""A message that did not leave: what its row says, on every path that sends one.

A publish outside a transaction writes its intent as sent in the same statement (no
second write on the happy path), and a re-send (recovery, an operator's retry) writes its
move as sent before the message leaves. When the broker then cannot be reached, the row
would say a message was sent that never was, and the job would wait for the dispatch
timeout. ``record`` undoes that claim on the failure path only (move ``send_failed``):
the row says never sent, and recovery sends it (``recovery.due``: an intent never
claimed after ``CELERY_IDEM_NEVER_SENT_TIMEOUT``, a re-sent job after its dispatch wait).

A broker that could not be reached (``unreachable``) gives the dispatch back: an outage
does not use up ``CELERY_IDEM_MAX_REDISPATCHES``. A broker that refused the message (too
large, not allowed) keeps the count, so a message that can never leave ends
undeliverable after that many tries.
"""

from __future__ import annotations

import logging
from typing import Any

from django.utils import timezone
from kombu.exceptions import KombuError, OperationalError

from .backends import Change, get_backend
from .persistence import persistence
from .states import State

logger = logging.getLogger(__name__)


def unreachable(exc: BaseException, app: Any) -> bool:
    """Whether ``exc`` (a publish's error) says ``app``'s broker could not be reached,
    rather than that it refused the message. A refusal can look like a lost connection
    (Redis closes the connection of a message over its size limit), so a connection
    error counts only when a fresh connection fails too (asked on the failure path
    only)."""
    if not isinstance(exc, OperationalError | ConnectionError | OSError):
        return False
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                                         interval_max=0)
    except Exception:  # noqa: BLE001 - any failure to connect is the answer
        return True
    return False


def answered(exc: BaseException, app: Any) -> bool:
    """Whether ``exc`` is the broker's or the transport's answer about the message (a
    connection or channel error, a message kombu could not encode) rather than a fault of
    the client's own code: kombu's Redis channel, found closed by a broker restart, can
    raise ``AttributeError`` from a publish. Only an answer can refuse a message."""
    with app.connection_for_write() as connection:  # not connected: its error classes
        own = (*connection.connection_errors, *connection.channel_errors)
    return isinstance(exc, (KombuError, ConnectionError, OSError, *own))


def change(job_id: int, attempt: int, dispatch_count: int, exc: BaseException,
           given_back: bool, task_name: str = "") -> Change:
    """The ``send_failed`` move of job ``job_id`` whose send (the ``dispatch_count``-th)
    raised ``exc``; ``given_back``: the dispatch count goes back by one."""
    count = dispatch_count - 1 if given_back and dispatch_count > 0 else dispatch_count
    return Change(job_id, "send_failed", State.PENDING, attempt=attempt,
                  dispatch_count=dispatch_count, task_name=task_name,
                  reason=f"{type(exc).__name__}: {exc}"[:500],
                  values={"sent_at": None, "dispatch_count": count})


def record(alias: str, changes: list[Change]) -> None:
    """Write ``changes`` (``change``); logged, never raised: the caller is already
    handling a send that failed, and a row left saying sent is still sent by recovery,
    after the dispatch timeout instead of the never-sent one."""
    if not changes:
        return
    try:
        with persistence():
            backend = get_backend(alias)
            for one in changes:  # guarded by the dispatch count: not batchable
                backend.apply(one, timezone.now())
    except Exception as exc:
        logger.error("could not record that %d message(s) were not sent: %s; recovery "
                     "sends them after CELERY_IDEM_DISPATCH_TIMEOUT", len(changes), exc,
                     extra={"action": "send_failed_unrecorded"})


def refused(job_id: int, exc: BaseException, task_name: str = "") -> Change:
    """The move that ends a fresh intent whose message the broker refused (too large,
    not allowed): FAILED as undeliverable with the broker's error, so the job never runs
    while its caller is told the publish failed (a copy that left anyway replays the
    failure)."""
    from .claims import describe_error  # claims imports the backends' users: on use
    from .errors import Undeliverable

    error = Undeliverable(f"the broker refused its message: {type(exc).__name__}: {exc}")
    return Change(job_id, "dead_lettered", State.PENDING, attempt=0, task_name=task_name,
                  reason=str(error)[:500], values={
                      "error": describe_error(error), "finished_at": timezone.now(),
                      "lease_expires_at": None, "sent_at": None})


def after_publish_error(alias: str, job_id: int | None, exc: BaseException, app: Any,
                        task_name: str = "") -> bool:
    """A publish outside a transaction raised ``exc`` after its intent was written: what
    the row says and whether the call may return. The contract: a call that returns runs
    once, a call that raises never runs.

    - The broker could not be reached and this publish wrote the intent (``job_id``):
      accepted. The row says never sent, recovery sends it within
      ``CELERY_IDEM_NEVER_SENT_TIMEOUT``, a warning is logged; returns True.
    - The broker refused the message (it answered, ``answered``, and is reachable): the
      intent ends FAILED (``refused``); returns False (the caller raises ``exc``).
    - The client failed (not the broker's answer): accepted as when the broker could not
      be reached, its dispatch count kept, so a fault that persists ends undeliverable
      after ``CELERY_IDEM_MAX_REDISPATCHES`` re-sends rather than failing the key for good
      on one transient fault.
    - The key's row is not this publish's (it existed): nothing of this call was written,
      so it raises as it is; returns False.
    """
    if job_id is None:
        return False
    if not unreachable(exc, app) and answered(exc, app):
        record(alias, [refused(job_id, exc, task_name)])
        return False
    record(alias, [change(job_id, 0, 0, exc, given_back=False, task_name=task_name)])
    logger.warning("job %s (%s) accepted, its message not sent: %s; recovery sends it "
                   "within CELERY_IDEM_NEVER_SENT_TIMEOUT", job_id, task_name, exc,
                   extra={"action": "publish_deferred", "job_id": job_id})
    return True
