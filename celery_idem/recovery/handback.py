"""The one rule for a claim that goes back: released, uncertain or dead-lettered.

Every path that hands a lost claim back asks ``plan``: the worker's MainProcess when a
pool child dies under an attempt (``recovery.worker``), a worker's shutdown, the
recovery pass for a claim past its lease (``recovery.sweep``) and an operator's release
(``celery_idem.actions``), and a live worker whose body lost its database connection
(``runner``, by ``hand_back_lost``). So a task declared ``on_stale_claim="uncertain"``
(its effect must not be repeated blindly) ends UNCERTAIN whichever path notices first,
and ``max_attempts`` counts the same attempts on all of them.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from celery import current_app
from django.utils import timezone

from ..backends import Backend, Change
from ..claims import COMMIT_BACKOFF, Claim, describe_error
from ..errors import ConnectionLost, PersistenceError, StoredFailure
from ..persistence import persistence, retrying
from ..states import State
from .resend import task_id_for

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HandBack:
    """The move that hands a claim back, and what a report calls it.

    ``resend``: the job's message is sent again once the move is committed, under the
    task id the move writes.
    """

    change: Change
    action: str
    resend: bool = False


#: The Celery apps whose task modules this process has imported (registered_task).
_imported_modules: weakref.WeakSet[Any] = weakref.WeakSet()


def registered_task(name: str) -> Any:
    """The task registered as ``name``, if any. Outside a worker (manage.py, a shell),
    Celery imports autodiscovered task modules only on demand, so import them, once per
    app and process: a name still unknown after that (a renamed or deleted task) stays
    unknown, and importing again cost ~15 ms for every such job of every pass."""
    app = current_app._get_current_object()
    task = app.tasks.get(name)
    if task is None and app not in _imported_modules:
        _imported_modules.add(app)
        app.loader.import_default_modules()
        task = app.tasks.get(name)
    return task


def resendable(job: Any) -> bool:
    """Whether the job's arguments are stored, so its message can be sent again."""
    return job.args is not None or job.kwargs is not None


def plan(backend: Backend, job: Any, task: Any, why: str, *, resend: bool,
         actor: str = "", attempt: int | None = None, rolled_back: bool = False) -> HandBack:
    """How the claim of ``job`` (a RUNNING row) goes back, by ``task``'s declarations.

    ``task``: the registered IdempotentTask, or None when this process does not know it
    (then the claim is released as asked, with nothing re-declared). ``resend``: send
    the job again after the move (recovery, an operator); False when something else
    brings the message back (Celery requeues it when a child is lost). ``attempt``: the
    attempt the caller saw (default the row's): a newer claim is never handed back.
    ``rolled_back``: the attempt's writes rolled back with its transaction (an atomic
    body), so nothing is uncertain: released even for a task declared
    ``on_stale_claim="uncertain"``.
    """
    seen = job.attempt if attempt is None else attempt

    def change(event: str, reason: str, **values: Any) -> Change:
        return Change(job.id, event, State.RUNNING, attempt=seen, values=values,
                      worker=job.worker, task_id=job.task_id, reason=reason, actor=actor,
                      task_name=job.task_name)

    if task is not None and task.on_stale_claim == "uncertain" and not rolled_back:
        return HandBack(change("uncertain", f"{why}; the task must not re-run blindly",
                               lease_expires_at=None, worker=""), "uncertain")
    if task is not None:
        limit = task.effective_max_attempts()
        if seen >= limit and backend.attempts_since_reset(job.id, seen) >= limit:
            error = StoredFailure(f"DeadLettered: attempt {seen} lost its worker and "
                                  f"max_attempts {limit} is reached")
            return HandBack(change("dead_lettered", f"dead-lettered: {why}",
                                   lease_expires_at=None, finished_at=timezone.now(),
                                   error=describe_error(error)), "dead_lettered")
    if resend and not resendable(job):
        # Back to PENDING all the same: a redelivered message can claim it at once.
        return HandBack(change("released", f"{why}; not sent again: no stored arguments",
                               lease_expires_at=None, worker=""), "skipped")
    if resend:
        return HandBack(change("released", why, lease_expires_at=None, worker="",
                               task_id=task_id_for(job), dispatch_count=job.dispatch_count + 1),
                        "released", resend=True)
    return HandBack(change("released", why, lease_expires_at=None, worker=""), "released")


def _hand_back_claim(claim: Claim, task: Any, why: str, *, rolled_back: bool = False) -> HandBack:
    """Hand back the claim a live worker holds, by ``plan``'s rule (its body lost the
    database connection: ``runner``). Nothing is re-sent: the worker re-queues the
    message. Tried again on a fresh connection after a dropped one, like a commit;
    PersistenceError when the database stays unreachable (the lease then expires and
    recovery hands the claim back)."""
    job = SimpleNamespace(id=claim.job_id, attempt=claim.attempt, worker=claim.worker,
                          task_id=claim.task_id, task_name=claim.task_name)
    back = retrying(claim.backend, lambda: plan(claim.backend, job, task, why, resend=False,
                                                rolled_back=rolled_back), COMMIT_BACKOFF)
    claim.apply(back.change)
    return back


def hand_back_lost(claim: Claim | None, task: Any, exc: BaseException,
                   again: Callable[[Callable[[Claim], Any]], None]) -> ConnectionLost:
    """The body lost its database connection (``backends.lost``), or an atomic body's
    commit did: not the body's failure. Its attempt goes back by ``plan``'s rule,
    counted against max_attempts; the caller's message then waits and comes back, to
    run again or meet what the rule decided (UNCERTAIN, dead-lettered). Returns the
    error the message waits with.

    ``claim``: a plain body's. None for an atomic body, whose claim rolled back with
    everything else: ``again`` claims once more in a transaction of its own, to record
    the attempt, released, never UNCERTAIN (nothing was committed; a commit that did
    land leaves nothing to claim, and the message replays it). Where the database stays
    unreachable nothing is recorded: a plain body's claim stays RUNNING until its lease
    expires and recovery hands it back; an atomic body left nothing committed.
    """
    cause = exc.__cause__ if isinstance(exc, PersistenceError) and exc.__cause__ else exc
    why = f"the body lost its database connection: {type(cause).__name__}: {cause}"[:400]
    try:
        if claim is not None:
            _hand_back_claim(claim, task, why)
        else:
            with persistence():
                again(lambda held: _hand_back_claim(held, task, why, rolled_back=True))
    except PersistenceError as error:
        logger.warning("could not hand back %s after its connection was lost: %r",
                       getattr(task, "name", task), error, extra={"action": "release_failed"})
    return ConnectionLost(why)
