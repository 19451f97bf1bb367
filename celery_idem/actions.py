"""Operator actions on jobs: retry, send now, release, resolve and forget.

The admin calls these, and so can a management command or a shell. Each one is a single
conditional write through the backend (which appends the history row with the acting user
in ``actor``), and reports what happened instead of raising: a job in the wrong state is
refused, and a job that moved between the operator's look and the write lost a race.
Anything that leaves the database (sending the task again) happens after the commit.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from typing import Any

from celery import current_app
from django.db import transaction
from django.utils import timezone

from . import states, unsent
from .backends import Change, get_backend
from .conf import settings
from .models import Job
from .recovery.handback import plan, registered_task, resendable
from .recovery.resend import redispatch, task_id_for
from .states import State

logger = logging.getLogger(__name__)

#: Longest text kept in a history row's reason.
REASON_MAX = 1000


class Outcome(enum.Enum):
    """What an operator action did to one job."""

    #: The transition was written (for forget: the rows were deleted).
    DONE = "done"
    #: The job's state does not allow the action; nothing was written.
    WRONG_STATE = "wrong_state"
    #: The job changed (state or attempt) since the operator looked; nothing was written.
    RACED = "raced"
    #: Retry and send now: the job has no stored arguments (STORE_ARGUMENTS off), so it
    #: cannot be sent again; nothing was written.
    NOT_STORED = "not_stored"
    #: Send now only: the job waits for a retry scheduled for later (its not-before), and
    #: its message is due then; nothing was written.
    SCHEDULED = "scheduled"
    #: Send now only: the job's message expired unclaimed (recovery ends it EXPIRED);
    #: nothing was written.
    EXPIRED = "expired"


@dataclass
class ActionResult:
    """The outcome for one job. ``task_id`` and ``dispatch_error`` are filled once the
    message is sent, which is after the commit (at once outside a transaction)."""

    job: Job
    outcome: Outcome
    task_id: str = ""
    dispatch_error: str = ""
    deleted: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.outcome is Outcome.DONE


def _reason(*parts: str) -> str:
    return ": ".join(p.strip() for p in parts if p and p.strip())[:REASON_MAX]


def _alias(job: Job) -> str:
    return job._state.db or settings.DATABASE


def _write(job: Job, change: Change) -> Outcome:
    """Make ``change`` as the operator saw the job; refresh ``job`` when it won."""
    if not states.applies(change.event, job.state):
        return Outcome.WRONG_STATE
    alias = _alias(job)
    if not get_backend(alias).apply(change, timezone.now()):
        return Outcome.RACED
    job.refresh_from_db(using=alias)
    return Outcome.DONE


def _move(job: Job, event: str, *, actor: str, reason: str, attempt: int | None,
          values: dict[str, Any]) -> Outcome:
    """Write move ``event`` from the state and attempt the operator saw."""
    return _write(job, Change(
        job.pk, event, State(job.state), attempt=job.attempt if attempt is None else attempt,
        values=values, reason=reason, actor=actor, task_id=values.get("task_id", ""),
        task_name=job.task_name))


def _dispatch_values(job: Job) -> dict[str, Any]:
    """What a transition that will send the job again writes: the new message's task id
    (so the row names the message in flight) and one more dispatch."""
    return {"task_id": task_id_for(job), "dispatch_count": job.dispatch_count + 1,
            "sent_at": timezone.now()}


def _send_after_commit(result: ActionResult, *, fresh: bool = True) -> None:
    """Send the job's task again, under the task id the transition wrote, after the commit.
    ``fresh``: without the message's expiry and retry count (``recovery.resend``)."""
    job = result.job

    def send() -> None:
        try:
            result.task_id = redispatch(job, task_id=job.task_id, fresh=fresh)
        # Any broker or routing error: the job stays PENDING, its row says never sent
        # (celery_idem.unsent), and recovery sends it; report it and go on.
        except Exception as exc:
            result.dispatch_error = str(exc) or type(exc).__name__
            unsent.record(_alias(job), [unsent.change(
                job.pk, job.attempt, job.dispatch_count, exc, unsent.unreachable(exc, current_app),
                job.task_name)])
            logger.warning("job %s was reset but could not be sent: %s", job.pk, exc,
                           extra={"action": "operator_dispatch_failed", "job_id": job.pk})
        else:
            logger.info("job %s sent again as task %s", job.pk, result.task_id,
                        extra={"action": "operator_dispatched", "job_id": job.pk,
                               "task_id": result.task_id})

    transaction.on_commit(send, using=_alias(job))


def retry(job: Job, *, actor: str, note: str = "", attempt: int | None = None,
          dispatch: bool = True, clear_steps: bool = False) -> ActionResult:
    """Reset a FAILED or UNCERTAIN job to PENDING and send its task again.

    A SUCCEEDED job is refused (WRONG_STATE): its effect happened, and running the key
    again is what idempotence prevents; forget it first to run it again on purpose.

    Args:
        job: the job as the operator saw it.
        actor: who acts (a username), written to the history row.
        note: why, appended to the history row's reason.
        attempt: the attempt the operator saw; default ``job.attempt``.
        dispatch: send the task after the commit (False: leave it to the reaper).
        clear_steps: delete the job's step checkpoints with the reset, so the next
            attempt runs every step again (default: completed steps are kept and skipped).

    Returns:
        The ActionResult; on DONE, the previous error's summary is in the history.
    """
    if job.args is None and job.kwargs is None and states.applies("reset", job.state):
        return ActionResult(job, Outcome.NOT_STORED)
    previous = ""
    if job.error:
        previous = f"{job.error.get('type', '')}: {job.error.get('message', '')}".strip(": ")
    reason = _reason(f"operator retry of a {str(job.state).lower()} job", note,
                     "completed steps cleared" if clear_steps else "",
                     f"was {previous}" if previous else "")
    with transaction.atomic(using=_alias(job)):
        outcome = _move(job, "reset", actor=actor, reason=reason, attempt=attempt, values={
            "error": None, "finished_at": None, "not_before": None, "lease_expires_at": None,
            **(_dispatch_values(job) if dispatch else {}),
        })
        if outcome is Outcome.DONE and clear_steps:
            get_backend(_alias(job)).clear_steps(job.pk)
    result = ActionResult(job, outcome)
    if result.done and dispatch:
        _send_after_commit(result)
    return result


def send_now(job: Job, *, actor: str, note: str = "", attempt: int | None = None
             ) -> ActionResult:
    """Send a PENDING job's stored message again now, as recovery sends a message presumed
    lost (the ``redispatched`` move, then the message after the commit), without waiting
    for ``CELERY_IDEM_DISPATCH_TIMEOUT``.

    Refused, with nothing written: a job that is not PENDING (WRONG_STATE), whose
    arguments are not stored (NOT_STORED), that waits for a retry scheduled for later
    (SCHEDULED) or whose message expired (EXPIRED). The move is fenced by the attempt and
    the re-send count the operator saw, so a job claimed or sent meanwhile is RACED.
    """
    if not states.applies("redispatched", job.state):
        return ActionResult(job, Outcome.WRONG_STATE)
    if not resendable(job):
        return ActionResult(job, Outcome.NOT_STORED)
    now = timezone.now()
    if job.not_before is not None and job.not_before > now:
        return ActionResult(job, Outcome.SCHEDULED)
    if job.expires_at is not None and job.expires_at < now:
        return ActionResult(job, Outcome.EXPIRED)
    task_id = task_id_for(job)
    result = ActionResult(job, _write(job, Change(
        job.pk, "redispatched", State.PENDING,
        attempt=job.attempt if attempt is None else attempt, dispatch_count=job.dispatch_count,
        values={"task_id": task_id, "dispatch_count": job.dispatch_count + 1, "sent_at": now},
        reason=_reason("sent again now by an operator", note), actor=actor, task_id=task_id,
        task_name=job.task_name)))
    if result.done:
        _send_after_commit(result, fresh=False)
    return result


def release(job: Job, *, actor: str, note: str = "", attempt: int | None = None,
            dispatch: bool = True) -> ActionResult:
    """Hand back a RUNNING job's claim, and send its task again.

    The claim goes back by the rule every lost claim follows (``recovery.handback``):
    PENDING, or UNCERTAIN for a task that must not re-run blindly, or dead-lettered once
    its attempts are used up. The attempt that held the claim is fenced out: if its
    worker is still alive, its commit will not match and is recorded as a late finish.
    Pass the ``attempt`` the operator confirmed, so a newer claim taken meanwhile is not
    released by mistake.
    """
    if not states.applies("released", job.state):
        return ActionResult(job, Outcome.WRONG_STATE)
    handback = plan(get_backend(_alias(job)), job, registered_task(job.task_name),
                    _reason("released by an operator", note), resend=dispatch, actor=actor,
                    attempt=attempt)
    result = ActionResult(job, _write(job, handback.change))
    if result.done and handback.resend:
        _send_after_commit(result)
    return result


def resolve(job: Job, *, actor: str, note: str, attempt: int | None = None) -> ActionResult:
    """Mark an UNCERTAIN job SUCCEEDED: the operator checked that its effect happened.

    ``note`` (required) says how they know; it is the history row's reason. The stored
    result stays as it was (usually empty): duplicates replay it to their callers.
    """
    if not note.strip():
        raise ValueError("resolving a job needs a note that says how its outcome is known")
    outcome = _move(job, "resolved", actor=actor, attempt=attempt,
                    reason=_reason("resolved as succeeded by an operator", note),
                    values={"finished_at": timezone.now(), "lease_expires_at": None,
                            "error": None})
    return ActionResult(job, outcome)


def forget(job: Job, *, actor: str, note: str = "", attempt: int | None = None) -> ActionResult:
    """Delete a job with its history and checkpoints, so its key can run again.

    The history goes with the row, so the deletion is logged here (logger
    ``celery_idem.actions``, action ``forgotten``); the admin also writes a LogEntry.
    The row is deleted only if it is still in the state and attempt the operator saw.
    """
    if job.state not in states.FORGETTABLE:
        return ActionResult(job, Outcome.WRONG_STATE)
    alias = _alias(job)
    seen = job.attempt if attempt is None else attempt
    with transaction.atomic(using=alias):
        locked = list(Job.objects.using(alias).select_for_update()
                      .filter(pk=job.pk, state=job.state, attempt=seen)
                      .values_list("pk", flat=True))
        if not locked:
            return ActionResult(job, Outcome.RACED)
        _, deleted = Job.objects.using(alias).filter(pk=job.pk).delete()
    counts = {label.rsplit(".", 1)[-1].lower(): n for label, n in deleted.items()}
    logger.warning(
        "job %s (%s:%s, %s, attempt %s) forgotten by %s: %s", job.pk, job.namespace, job.key,
        job.state, seen, actor or "-", note or "no note",
        extra={"action": "forgotten", "job_id": job.pk, "namespace": job.namespace,
               "key": job.key, "state": str(job.state), "attempt": seen, "actor": actor,
               "reason": note, "deleted": counts},
    )
    return ActionResult(job, Outcome.DONE, deleted=counts)
