"""The claim decision, and the won claim whose attempt fences every write its holder makes.

``acquire`` is the one place that decides how a worker gets a key: claim it from
PENDING, insert it when the intent is missing, take it over when the lease of the
attempt holding it expired, or give up and say what stood in the way (a finished key to
replay, a live claim, other arguments). The backend only executes each move.
The ``Claim`` it returns commits the outcome (succeeded, failed, retry scheduled,
released) only while its attempt still owns the key.
Database errors surface as PersistenceError with the driver's error as the cause.
"""

from __future__ import annotations

import enum
import logging
import traceback
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from . import states
from .backends import Backend, Change, Claimant, ClaimOutcome, Intent, JobRow, get_backend
from .errors import ClaimLost
from .liveness import worker_name
from .metrics.tracing import span
from .persistence import persistence, retrying
from .states import State

logger = logging.getLogger(__name__)

#: Backoff (seconds) between tries of bookkeeping on a fresh connection: a claim gives
#: up after these (the message waits and comes back); a commit after the body ran keeps
#: trying for longer, since giving up would leave the key RUNNING for its lease.
CLAIM_BACKOFF = (0.1, 0.3, 1.0, 2.0)
COMMIT_BACKOFF = (0.1, 0.3, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)

def worker_id(hostname: str | None, pid: int) -> str:
    """How a claim names the pool process that holds it: ``<worker>/<pid>``, the worker
    being the host name and, in a worker that beats, its run (``liveness.worker_name``)."""
    return f"{worker_name(hostname)}/{pid}"


def describe_error(exc: BaseException) -> dict[str, Any]:
    """The JSON record of an exception that the job row stores and the admin shows; its
    arguments too where they are plain JSON values, for a replay to raise them again."""
    record: dict[str, Any] = {
        "type": type(exc).__name__,
        "module": type(exc).__module__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }
    if all(arg is None or isinstance(arg, (str, int, float, bool)) for arg in exc.args):
        record["args"] = list(exc.args)
    return record


@dataclass
class Claim:
    """Attempt ``attempt`` of job ``job_id`` holds the key until it commits an outcome."""

    backend: Backend
    job_id: int
    attempt: int
    worker: str
    task_id: str
    lease_seconds: float
    #: The job's task, for the announcements (``signals.transition``).
    task_name: str = ""
    #: Handed to the body's replacement (``replacement.hand_over``). Kept here, not on
    #: the request: Celery runs the body under a copy of the request that is popped
    #: before the runner sees the body's Ignore.
    replaced: bool = False

    def _move(self, event: str, reason: str = "", *, final: bool = False,
              **values: Any) -> bool:
        return self.apply(Change(self.job_id, event, State.RUNNING, attempt=self.attempt,
                                 values=values, worker=self.worker, task_id=self.task_id,
                                 reason=reason, task_name=self.task_name), final=final)

    def apply(self, change: Change, *, final: bool = False) -> bool:
        """Write ``change`` (a move fenced by this attempt), tried again on a fresh
        connection after a dropped one; whether it moved the row."""
        retried: list[bool] = []
        with span("celery_idem.commit", self.task_name, event=change.event):
            moved = retrying(self.backend,
                             lambda: self.backend.apply(change, timezone.now(), final=final),
                             COMMIT_BACKOFF, retried)
        if not moved and retried:
            # A try that failed on a dropped connection may have landed: the fenced
            # retry then matches nothing. The row in the move's target under this
            # attempt says it did (only this attempt's holder writes it).
            return retrying(self.backend, lambda: self._landed(change), COMMIT_BACKOFF)
        return moved

    def _landed(self, change: Change) -> bool:
        return self.backend.state_of(self.job_id) == (change.to_state, self.attempt)

    def _late(self, what: str) -> None:
        """Record that this fenced-out attempt finished anyway; the newer attempt stands.
        The line names the state the row is in, whatever made it so (the backends read
        it in the statement), so the history stays a path through the move table."""
        self._move("late_finish",
                   f"attempt {self.attempt} {what} after losing its claim; not recorded")

    def succeed(self, result: Any, *, ends_transaction: bool = False) -> bool:
        """Store ``result``. False (and a late_finish line) if a newer attempt owns the key.
        ``ends_transaction``: the last write of an atomic body's transaction, which may
        commit with it (``Backend.apply``'s ``final``); lost, it writes nothing more, as
        the transaction rolls back."""
        if self._move("succeeded", final=ends_transaction, result=result,
                      finished_at=timezone.now(), lease_expires_at=None):
            return True
        if not ends_transaction:
            self._late("succeeded")
        return False

    def fail(self, exc: BaseException, event: str = "failed", reason: str = "") -> bool:
        """Store the failure; the key stays FAILED until an operator resets it."""
        if self._move(event, reason or f"{type(exc).__name__}: {exc}"[:500],
                      error=describe_error(exc), finished_at=timezone.now(),
                      lease_expires_at=None):
            return True
        self._late("failed")
        return False

    def schedule_retry(self, not_before: datetime | None, reason: str,
                       message: dict[str, Any] | None = None,
                       arguments: dict[str, Any] | None = None) -> bool:
        """Back to PENDING; the retry message claims again with the next attempt.
        ``message``: the retry's envelope, which a later re-send sends (its retry count);
        ``arguments``: the retry's new fingerprint and stored arguments, if it has any."""
        kept: dict[str, Any] = {"message": message} if message is not None else {}
        return self._move("retry_scheduled", reason, not_before=not_before,
                          lease_expires_at=None, **kept, **(arguments or {}))

    def release(self, reason: str) -> bool:
        """Back to PENDING now, for another attempt to claim."""
        return self._move("released", reason, lease_expires_at=None)

    def hand_over(self, reason: str) -> bool:
        """The body replaced itself: the key's outcome is its replacement's. The claim
        stays RUNNING without a lease or a worker, so nothing hands it back or takes it
        over; the replacement's last step commits it (``celery_idem.tasks.replaced``)."""
        return self._move("replaced", reason, lease_expires_at=None, worker="")

    def heartbeat(self, seconds: float | None = None) -> datetime:
        """Extend the lease by ``seconds`` (default: the claim's lease) from now.

        Raises ClaimLost when a newer attempt owns the key: stop working, the effect of this
        attempt will not be recorded.
        """
        until = timezone.now() + timedelta(seconds=seconds or self.lease_seconds)
        if not self._move("heartbeat", lease_expires_at=until):
            raise ClaimLost(f"attempt {self.attempt} of job {self.job_id} lost its claim")
        return until

    def attempts(self) -> int:
        """How many claims count against max_attempts, this one included."""
        with persistence():
            return self.backend.attempts_since_reset(self.job_id, self.attempt)


class Next(enum.Enum):
    """What a claim that did not win does next (``decide``)."""

    CLAIM = "claimed"          # PENDING and claimable: a concurrent write got in; again
    TAKE_OVER = "taken_over"   # RUNNING past its lease: the holder is presumed dead
    INSERT = "insert"          # no row: the producer's intent is missing
    GIVE_UP = "give_up"        # finished, live claim, held back, or other arguments


#: The reasons the history gives for claims that are not plain.
REASONS = {Next.TAKE_OVER: "the previous attempt's lease had expired",
           Next.INSERT: "no intent was published"}

#: Claims to try before giving up on a row that keeps changing under us.
CLAIM_TRIES = 3


def decide(row: JobRow | None, intent: Intent, claimant: Claimant) -> Next:
    """What to do about the row that a claim did not win.

    On PostgreSQL a claim that waited for another transaction's row lock reports the
    row as its statement's snapshot saw it (still PENDING); a new statement sees the
    outcome, hence CLAIM again.
    """
    if row is None:
        return Next.INSERT
    if row.fingerprint != intent.fingerprint:
        return Next.GIVE_UP
    if not states.claimable(row.not_before, row.task_id, claimant.now, claimant.task_id):
        return Next.GIVE_UP
    if row.state is State.PENDING:
        return Next.CLAIM
    if states.lease_expired(row.state, row.lease_expires_at, claimant.now):
        return Next.TAKE_OVER
    return Next.GIVE_UP


def acquire(intent: Intent, *, worker: str, task_id: str, lease_seconds: float,
            using: str, dedicated: bool = False, insert_missing: bool = True,
            insert_first: bool = False) -> tuple[ClaimOutcome, Claim | None]:
    """Claim ``intent``'s key for one attempt. Returns the outcome and, if won, the Claim
    (which commits on the same connection). ``dedicated``: see ``get_backend``.
    ``insert_missing``: insert the row already claimed when there is none (a message that
    no library producer sent); False gives up instead (its intent must exist).
    ``insert_first``: no intent was written for this message (broker durability), so the
    row most likely does not exist: try the insert first, one statement for a fresh key
    (an existing row comes back from it and is decided as a lost claim)."""
    backend = get_backend(using, dedicated)
    now = timezone.now()
    claimant = Claimant(worker, task_id, now, now + timedelta(seconds=lease_seconds))
    first = Next.INSERT if insert_first else Next.CLAIM
    with span("celery_idem.claim", intent.task_name):
        outcome = retrying(backend,
                           lambda: _claim(backend, intent, claimant, insert_missing, first),
                           CLAIM_BACKOFF)
    if not outcome.won or outcome.row is None:
        return outcome, None
    return outcome, Claim(backend, outcome.row.id, outcome.row.attempt, worker, task_id,
                          lease_seconds, intent.task_name)


def commit_new(intent: Intent, claimant: Claimant, result: Any, *, using: str) -> bool:
    """An optimistic atomic body's commit: the key's row inserted already SUCCEEDED with
    ``result``, as the last write of the body's transaction. False when the key has a
    row: nothing was written, and the caller rolls its transaction back."""
    backend = get_backend(using)
    with span("celery_idem.commit", intent.task_name, event="committed"), persistence():
        return backend.commit_new(intent, claimant, result, timezone.now())


def _claim(backend: Backend, intent: Intent, claimant: Claimant, insert_missing: bool,
           first: Next) -> ClaimOutcome:
    outcome = _step(backend, first, intent, claimant)
    row = outcome.row
    if not outcome.won and row is not None and _ours(row, claimant):
        # An earlier try of this very claim landed before its connection dropped.
        return ClaimOutcome(True, row)
    for _ in range(CLAIM_TRIES):
        if outcome.won:
            break
        step = decide(outcome.row, intent, claimant)
        if step is Next.GIVE_UP or (step is Next.INSERT and not insert_missing):
            break
        outcome = _step(backend, step, intent, claimant)
    return outcome


def _step(backend: Backend, step: Next, intent: Intent, claimant: Claimant) -> ClaimOutcome:
    if step is Next.INSERT:
        return backend.claim_new(intent, claimant, REASONS[step])
    return backend.claim(step.value, intent, claimant, REASONS.get(step, ""))


def _ours(row: JobRow, claimant: Claimant) -> bool:
    """Whether ``row`` holds the claim ``claimant`` made: same task id and the very lease
    it wrote (a timestamp taken once per claim, kept across its tries)."""
    return (row.state is State.RUNNING and row.task_id == claimant.task_id
            and row.lease_expires_at == claimant.lease_expires_at)
