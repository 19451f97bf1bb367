"""Django signals and log lines for every transition, so projects can count them.

``transition`` is sent (and the log line written) once the write is committed: inside an
atomic task body that is after the body's transaction commits, so a rolled-back claim is
never reported.
"""

from __future__ import annotations

import logging
import time

from django.db import transaction
from django.dispatch import Signal

logger = logging.getLogger("celery_idem.transitions")

#: Sent with ``job_id``, ``event``, ``from_state``, ``to_state``, ``attempt``, ``worker``,
#: ``task_id``, ``reason``, ``actor``, ``task_name`` (the job's task, "" where the writer
#: does not know it) and ``clock`` (``time.monotonic()`` in the writing process when the
#: write was made, not when the signal is sent: inside an atomic body the claim is
#: announced at the commit, so durations between two moves of one process come from it)
#: after a transition is committed.
transition = Signal()

#: Sent with ``task_name``, ``job_id`` and ``attempt`` (the live claim's) when a duplicate
#: message meets a live claim of its key and is put back to wait (``on_in_progress``
#: "wait"); no row is written, so no ``transition`` is sent.
duplicate_waiting = Signal()


def announce(using: str, job_id: int, event: str, from_state: str | None, to_state: str,
             attempt: int, worker: str = "", task_id: str = "", reason: str = "",
             actor: str = "", task_name: str = "") -> None:
    """Log and signal a transition after the surrounding transaction commits."""
    if not transition.receivers and not logger.isEnabledFor(logging.INFO):
        return  # nobody listens (the usual case, twice a task): build nothing
    fields = {
        "job_id": job_id, "event": event, "from_state": from_state, "to_state": to_state,
        "attempt": attempt, "worker": worker, "task_id": task_id, "reason": reason,
        "actor": actor, "task_name": task_name, "clock": time.monotonic(),
    }

    def send() -> None:
        logger.info("job %s %s: %s -> %s (attempt %s) %s", job_id, event, from_state,
                    to_state, attempt, reason, extra={"action": event, **fields})
        transition.send(sender=None, **fields)

    transaction.on_commit(send, using=using)
