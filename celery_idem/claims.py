"""A won claim: the attempt number that fences every write its holder makes.

``acquire`` asks the backend for the claim; the ``Claim`` it returns commits the outcome
(succeeded, failed, retry scheduled, released) only while its attempt still owns the key.
Database errors surface as PersistenceError with the driver's error as the cause.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from .backends import Backend, Claimant, ClaimOutcome, Intent, get_backend
from .errors import ClaimLost, PersistenceError
from .states import State


@contextmanager
def persistence() -> Iterator[None]:
    """Turn database errors into PersistenceError, keeping the driver's error as cause."""
    try:
        yield
    except DatabaseError as exc:
        raise PersistenceError(f"the job database failed: {exc}") from exc


def worker_id(hostname: str | None, pid: int) -> str:
    """How a claim names the pool process that holds it."""
    return f"{hostname or 'local'}/{pid}"


def describe_error(exc: BaseException) -> dict[str, Any]:
    """The JSON record of an exception that the job row stores and the admin shows."""
    return {
        "type": type(exc).__name__,
        "module": type(exc).__module__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


@dataclass
class Claim:
    """Attempt ``attempt`` of job ``job_id`` holds the key until it commits an outcome."""

    backend: Backend
    job_id: int
    attempt: int
    worker: str
    task_id: str
    lease_seconds: float

    def _move(self, event: str, reason: str = "", **values: Any) -> bool:
        with persistence():
            return self.backend.transition(
                self.job_id, event, State.RUNNING, attempt=self.attempt, values=values,
                now=timezone.now(), worker=self.worker, task_id=self.task_id, reason=reason,
            )

    def _late(self, what: str) -> None:
        """Record that this fenced-out attempt finished anyway; the newer attempt stands."""
        with persistence():
            self.backend.record(
                self.job_id, "late_finish", State.RUNNING, self.attempt, now=timezone.now(),
                worker=self.worker, task_id=self.task_id,
                reason=f"attempt {self.attempt} {what} after losing its claim; not recorded",
            )

    def succeed(self, result: Any) -> bool:
        """Store ``result``. False (and a late_finish line) if a newer attempt owns the key."""
        now = timezone.now()
        if self._move("succeeded", result=result, finished_at=now, lease_expires_at=None):
            return True
        self._late("succeeded")
        return False

    def fail(self, exc: BaseException, event: str = "failed", reason: str = "") -> bool:
        """Store the failure; the key stays FAILED until an operator resets it."""
        now = timezone.now()
        if self._move(event, reason or f"{type(exc).__name__}: {exc}"[:500],
                      error=describe_error(exc), finished_at=now, lease_expires_at=None):
            return True
        self._late("failed")
        return False

    def schedule_retry(self, not_before: datetime | None, reason: str) -> bool:
        """Back to PENDING; the retry message claims again with the next attempt."""
        return self._move("retry_scheduled", reason, not_before=not_before,
                          lease_expires_at=None)

    def release(self, reason: str) -> bool:
        """Back to PENDING now, for another attempt to claim."""
        return self._move("released", reason, lease_expires_at=None)

    def heartbeat(self, seconds: float | None = None) -> datetime:
        """Extend the lease by ``seconds`` (default: the claim's lease) from now.

        Raises ClaimLost when a newer attempt owns the key: stop working, the effect of this
        attempt will not be recorded.
        """
        now = timezone.now()
        until = now + timedelta(seconds=seconds or self.lease_seconds)
        with persistence():
            alive = self.backend.heartbeat(self.job_id, self.attempt, until, now)
        if not alive:
            raise ClaimLost(f"attempt {self.attempt} of job {self.job_id} lost its claim")
        return until


#: Claims to try when the row looked claimable but the write did not match.
CLAIM_TRIES = 3


def _raced(outcome: ClaimOutcome, intent: Intent, claimant: Claimant) -> bool:
    """True when the claim lost only to a concurrent write, so trying again can tell.

    On PostgreSQL a claim that waited for another transaction's row lock reports the row
    as its statement's snapshot saw it (still PENDING); a new statement sees the outcome.
    """
    row = outcome.row
    return (not outcome.won and row is not None and row.state is State.PENDING
            and row.fingerprint == intent.fingerprint
            and (row.not_before is None or row.not_before <= claimant.now
                 or row.task_id == claimant.task_id))


def attempts_since_reset(job_id: int, attempt: int, using: str) -> int:
    """How many of the job's ``attempt`` claims count against max_attempts: those since an
    operator last reset it (all of them if never). The attempt number is a fencing token
    and never goes back, so a reset job gets a fresh budget this way."""
    from .models import Transition

    base = (Transition.objects.using(using).filter(job_id=job_id, event="reset")
            .order_by("-id").values_list("attempt", flat=True).first())
    return attempt - (base or 0)


def acquire(intent: Intent, *, worker: str, task_id: str, lease_seconds: float,
            using: str, dedicated: bool = False) -> tuple[ClaimOutcome, Claim | None]:
    """Claim ``intent``'s key for one attempt. Returns the outcome and, if won, the Claim
    (which commits on the same connection). ``dedicated``: see ``get_backend``."""
    backend = get_backend(using, dedicated)
    now = timezone.now()
    claimant = Claimant(worker, task_id, now, now + timedelta(seconds=lease_seconds))
    with persistence():
        for _ in range(CLAIM_TRIES):
            outcome = backend.claim(intent, claimant)
            if not _raced(outcome, intent, claimant):
                break
    if not outcome.won or outcome.row is None:
        return outcome, None
    return outcome, Claim(backend, outcome.row.id, outcome.row.attempt, worker, task_id,
                          lease_seconds)
