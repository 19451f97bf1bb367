"""Django signals and log lines for every transition, so projects can count them.

``transition`` is sent (and the log line written) once the write is committed: inside an
atomic task body that is after the body's transaction commits, so a rolled-back claim is
never reported.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.dispatch import Signal

logger = logging.getLogger("celery_idem.transitions")

#: Sent with ``job_id``, ``event``, ``from_state``, ``to_state``, ``attempt``, ``worker``,
#: ``task_id``, ``reason`` and ``actor`` after a transition is committed.
transition = Signal()


def announce(using: str, job_id: int, event: str, from_state: str | None, to_state: str,
             attempt: int, worker: str = "", task_id: str = "", reason: str = "",
             actor: str = "") -> None:
    """Log and signal a transition after the surrounding transaction commits."""
    fields = {
        "job_id": job_id, "event": event, "from_state": from_state, "to_state": to_state,
        "attempt": attempt, "worker": worker, "task_id": task_id, "reason": reason,
        "actor": actor,
    }

    def send() -> None:
        logger.info("job %s %s: %s -> %s (attempt %s) %s", job_id, event, from_state,
                    to_state, attempt, reason, extra={"action": event, **fields})
        transition.send(sender=None, **fields)

    if transition.receivers or logger.isEnabledFor(logging.INFO):
        transaction.on_commit(send, using=using)
