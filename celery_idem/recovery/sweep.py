"""Recovery: one pass that finds the jobs a lost worker or a lost message left behind.

Nothing is ever lost and nothing stays stuck, whatever crashes (docs/how-to/recovery.md):

1. **Lost messages.** A PENDING job that no worker claimed long after its message was
   due (a broker that lost it, a publish that failed after the intent was written, an
   atomic body whose transaction died with its worker) is sent again. The wait starts
   at ``DISPATCH_TIMEOUT`` and doubles with each re-dispatch, up to
   ``DISPATCH_MAX_BACKOFF``; ``dispatch_count`` keeps the count. A job is not due before
   its message's ETA (``not_before``), so scheduled work is never presumed lost early.
   An intent written inside a transaction whose message never left (``sent_at`` empty:
   its producer died between the commit and the send) is sent after the shorter
   ``NEVER_SENT_TIMEOUT``. After ``MAX_REDISPATCHES`` unclaimed re-sends, or when its
   stored message cannot be decoded, the job ends FAILED as undeliverable.
   A job whose message expired unclaimed (its ``expires`` passed) ends EXPIRED and is
   never sent again.
2. **Stale claims.** A RUNNING job past its lease, or held by a worker that stopped
   beating (``recovery.liveness``), lost its worker. It goes back to PENDING and is sent
   again; or to FAILED ("dead-lettered") once its attempts reach the
   task's ``max_attempts``; or to UNCERTAIN when the task declared
   ``on_stale_claim="uncertain"`` (its effect must not be repeated blindly), for an
   operator to decide.

Lost messages are swept first, so a claim released by this pass is not sent twice by it.
Each sweep walks its rows by id in bounded batches; each batch is one short transaction
whose rows are locked against concurrent passes (``FOR UPDATE SKIP LOCKED`` on
PostgreSQL, see ``Backend.locked_batch``), and every write in it is a conditional move of
the state machine; the stale claims of a batch are moved together
(``Backend.apply_batch``: one statement per kind of move on PostgreSQL), by the rule
of ``recovery.handback``. Messages
leave only after their batch commits: if sending fails, the row says never sent
(``celery_idem.unsent``) and a later pass sends it again.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from celery import current_app
from django.db.models import Q
from django.utils import timezone

from .. import unsent
from ..backends import Backend, Change, get_backend
from ..claims import describe_error
from ..conf import settings
from ..envelope import Undecodable
from ..errors import Expired, Undeliverable
from ..models import Job
from ..persistence import persistence
from ..states import State, live_q, stale_q
from . import liveness
from .due import Sweep, expired, lost_messages, redispatch_wait
from .handback import HandBack, plan, registered_task, resendable
from .resend import redispatch, task_id_for

logger = logging.getLogger(__name__)

UNKNOWN_TASK = "task not registered in this process"

#: What a pass can do to a job, in the order reports list them.
ACTIONS = (
    "released",       # stale claim -> PENDING, sent again
    "redispatched",   # PENDING whose message was presumed lost, sent again
    "dead_lettered",  # stale claim at max_attempts -> FAILED
    "uncertain",      # stale claim of a task that must not re-run blindly -> UNCERTAIN
    "expired",        # PENDING whose message expired unclaimed -> EXPIRED
    "undeliverable",  # PENDING re-sent too often, or its message undecodable -> FAILED
    "skipped",        # left alone: task unknown here, or no stored arguments to send
    "send_failed",    # moved, but not sent: the row says so, and a later pass sends it
)

@dataclass
class Report:
    """What one pass did: per action, how many jobs of each task."""

    counts: dict[str, Counter[str]] = field(
        default_factory=lambda: {action: Counter() for action in ACTIONS})

    def add(self, action: str, task_name: str) -> None:
        self.counts[action][task_name] += 1

    def total(self, action: str) -> int:
        return sum(self.counts[action].values())

    def as_dict(self) -> dict[str, dict[str, int]]:
        """JSON for the task result: only the actions that happened."""
        return {action: dict(c) for action, c in self.counts.items() if c}

    def lines(self) -> list[str]:
        """One human-readable line per action that happened."""
        return [
            f"{action}: {self.total(action)} ("
            + ", ".join(f"{name}: {n}" for name, n in sorted(c.items())) + ")"
            for action, c in self.counts.items() if c
        ]

    def __str__(self) -> str:
        return "; ".join(self.lines()) or "nothing to do"


# -- what to do with a row -------------------------------------------------------------

@dataclass
class Batch:
    """What one locked batch decided: moves made together in its transaction, then the
    messages sent after it commits (job, task id)."""

    moves: list[tuple[Job, HandBack]] = field(default_factory=list)
    sends: list[tuple[Job, str]] = field(default_factory=list)


@dataclass
class Pass:
    """One recovery pass over one database."""

    backend: Backend
    now: datetime
    report: Report = field(default_factory=Report)
    #: Task name -> the registered task or None, resolved once per pass, not per job.
    tasks: dict[str, Any] = field(default_factory=dict)
    #: (task name, why) -> how many jobs this pass left alone.
    skipped: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: The error of the broker this pass could not reach: no more sends are tried.
    broker_down: Exception | None = None
    #: Jobs whose send failed in this pass: they now look never sent, and wait for the
    #: next pass rather than being tried again by this one's next sweep.
    unsent: set[int] = field(default_factory=set)

    def task(self, name: str) -> Any:
        if name not in self.tasks:
            self.tasks[name] = registered_task(name)
        return self.tasks[name]

    def knows(self, name: str) -> bool:
        """Whether this process has the task's declarations a stale claim needs (may it
        re-run? how often?); without them neither hand-back is safe."""
        return getattr(self.task(name), "on_stale_claim", None) is not None

    def lost_message(self, job: Job, batch: Batch) -> None:
        """Send a PENDING job again; the count and the new task id go in the same write."""
        if job.id in self.unsent:
            return
        if job.dispatch_count >= int(settings.MAX_REDISPATCHES):
            self.undeliverable(job, f"sent {job.dispatch_count + 1} times and never claimed: "
                                    f"no worker runs task {job.task_name!r}, or its "
                                    "messages are lost")
            return
        if not resendable(job):
            self._skip(job, "no stored arguments to send")
            return
        task_id = task_id_for(job)
        wait = redispatch_wait(job.dispatch_count)
        reason = (f"no worker claimed it within {wait:g}s of its message being due: "
                  f"message presumed lost, re-dispatch {job.dispatch_count + 1}")
        change = Change(job.id, "redispatched", State.PENDING, attempt=job.attempt,
                        dispatch_count=job.dispatch_count, task_id=task_id, reason=reason,
                        task_name=job.task_name, values={"dispatch_count": job.dispatch_count + 1,
                                "task_id": task_id, "sent_at": self.now})
        if self.backend.apply(change, self.now):
            batch.sends.append((job, task_id))
            self.report.add("redispatched", job.task_name)

    def expired(self, job: Job, batch: Batch) -> None:
        """A PENDING job whose message expired unclaimed ends EXPIRED."""
        self._end(job, "expired", Expired(
            f"message expired at {job.expires_at:%Y-%m-%d %H:%M:%S%z} before any worker "
            "claimed it"))

    def undeliverable(self, job: Job, why: str) -> None:
        """A job that cannot be sent (or never gets claimed) ends FAILED with ``why``."""
        self._end(job, "dead_lettered", Undeliverable(why), "undeliverable")

    def _end(self, job: Job, event: str, error: Exception, action: str = "") -> None:
        change = Change(job.id, event, State.PENDING, attempt=job.attempt,
                        reason=str(error)[:500], task_name=job.task_name, values={
                            "error": describe_error(error), "finished_at": self.now,
                            "lease_expires_at": None})
        if self.backend.apply(change, self.now):
            self.report.add(action or event, job.task_name)

    def known_tasks(self, stale: Q) -> Q:
        """``stale`` narrowed to the claims of tasks this process knows. The others are
        counted as skipped in one query, not locked and read one by one on every pass
        (5,000 claims of a task a deploy removed took ~1 s a pass at 10M jobs)."""
        unknown = {name: n for name, n in self.backend.task_counts(stale).items()
                   if not self.knows(name)}
        for name, n in unknown.items():
            self.report.counts["skipped"][name] += n
            self.skipped[(name, UNKNOWN_TASK)] += n
        return stale & ~Q(task_name__in=sorted(unknown)) if unknown else stale

    def stale_claim(self, job: Job, batch: Batch) -> None:
        """Hand back the claim of a worker presumed dead by its lease."""
        self.hand_back(job, batch, f"stale claim: attempt {job.attempt} by "
                                   f"{job.worker or 'unknown worker'}, lease expired at "
                                   f"{job.lease_expires_at:%Y-%m-%d %H:%M:%S%z}")

    def hand_back(self, job: Job, batch: Batch, lost: str) -> None:
        """Hand back the claim of a worker that is presumed dead (``recovery.handback``)."""
        if not self.knows(job.task_name):
            # Leave it to a process that knows the task, or an operator.
            self._skip(job, UNKNOWN_TASK)
            return
        batch.moves.append((job, plan(self.backend, job, self.task(job.task_name), lost,
                                      resend=True)))

    def apply(self, batch: Batch) -> None:
        """Make the batch's moves; count those that matched and queue their messages."""
        if not batch.moves:
            return
        moved = self.backend.apply_batch([h.change for _, h in batch.moves], self.now)
        for job, handback in batch.moves:
            if job.id in moved:
                self.report.add(handback.action, job.task_name)
                if handback.resend:
                    batch.sends.append((job, handback.change.values["task_id"]))

    def send(self, job: Job, task_id: str) -> None:
        """Send the job's message, its move written; a send that fails says so on the
        row (``unsent``): never sent, so recovery sends it again. Once the broker cannot
        be reached, the pass tries no more sends (each would wait for the publish
        retries) and records them as not sent."""
        try:
            if self.broker_down is not None:
                raise self.broker_down
            redispatch(job, task_id=task_id)
        except Undecodable as exc:
            self.undeliverable(job, str(exc))
        except Exception as exc:
            self.unsent.add(job.id)
            given_back = unsent.unreachable(exc, current_app)
            if given_back:
                self.broker_down = exc
            unsent.record(self.backend.alias, [unsent.change(
                job.id, job.attempt, job.dispatch_count + 1, exc, given_back, job.task_name)])
            if exc is not self.broker_down or not self.report.total("send_failed"):
                logger.error("could not send job %s (%s) again: %s", job.id, job.task_name,
                             exc, extra={"action": "redispatch_failed", "job_id": job.id})
            self.report.add("send_failed", job.task_name)

    def _skip(self, job: Job, why: str) -> None:
        # One log line per task and reason a pass, not per job: a deploy that dropped a
        # task leaves thousands of its claims to skip on every pass.
        self.skipped[(job.task_name, why)] += 1
        self.report.add("skipped", job.task_name)

    def log_skipped(self) -> None:
        for (task_name, why), n in self.skipped.items():
            logger.warning("recovery left %d job(s) of %s alone: %s", n, task_name, why,
                           extra={"action": "reap_skipped", "task_name": task_name})


# -- the pass --------------------------------------------------------------------------

def reap(*, now: datetime | None = None, using: str | None = None,
         batch_size: int | None = None) -> Report:
    """Run one recovery pass and return what it did. Safe to run concurrently.

    ``now`` moves the pass's clock (tests, or an operator looking ahead); database errors
    raise PersistenceError.
    """
    run = Pass(get_backend(using or settings.DATABASE), now or timezone.now())
    limit = batch_size or settings.REAPER_BATCH_SIZE
    with persistence():
        _sweep(run, Sweep(expired(run.now), ("expires_at", "id")), limit, run.expired)
        # The lost messages: sent and unclaimed, a range per re-dispatch count; never sent.
        for lost in lost_messages(run.now):
            if run.broker_down is not None:
                break  # nothing can be sent: the next pass sends them
            _sweep(run, lost, limit, run.lost_message)
        stale = run.known_tasks(stale_q(run.now))
        _sweep(run, Sweep(stale, ("lease_expires_at", "id")), limit, run.stale_claim)
        # The claims of workers that stopped beating, whatever their lease.
        # (Those past their lease too went with the stale claims.)
        watching = getattr(run.backend, "watches_workers", True)
        for dead in liveness.dead_workers(run.backend.alias, run.now) if watching else ():
            held = run.known_tasks(dead.claims() & live_q(run.now))
            _sweep(run, Sweep(held, ("lease_expires_at", "id")), limit,
                   partial(run.hand_back, lost=dead.why(float(settings.WORKER_TIMEOUT))))
            liveness.forget(run.backend.alias, dead)
    run.log_skipped()
    report = run.report
    level = logging.WARNING if any(report.total(a) for a in (
        "dead_lettered", "uncertain", "send_failed", "undeliverable")) else logging.INFO
    logger.log(level, "recovery pass: %s", report,
               extra={"action": "reap", "counts": report.as_dict()})
    return report


#: Walks of one sweep at most: another from the start after a walk that acted.
WALKS = 3


def _sweep(run: Pass, sweep: Sweep, limit: int,
           handle: Callable[[Job, Batch], None]) -> None:
    """Walk the rows of ``sweep`` in its index's order, one locked batch at a time; then
    again from the start while a walk moved or sent something (at most ``WALKS``).

    A batch skips the rows a concurrent pass holds, and the walk's keyset moves past
    them: on PostgreSQL that pass returned them and handles them, but an InnoDB locking
    read can hold rows it read and did not return, so a row both passes read and neither
    returned is passed over by both walks (seen: 119 of 120 stale claims released by two
    passes at once on MariaDB), and found by the next from the start."""
    for _ in range(WALKS):
        if not _walk(run, sweep, limit, handle):
            return


def _walk(run: Pass, sweep: Sweep, limit: int,
          handle: Callable[[Job, Batch], None]) -> bool:
    """One walk of ``sweep`` from its start; whether it moved or sent anything (a row it
    only skipped stays where it is, and another walk would skip it again)."""
    after = Q()
    acted = False
    while True:
        batch = Batch()
        with run.backend.locked_batch(sweep.condition & after, limit, sweep.order) as jobs:
            for job in jobs:
                handle(job, batch)
            run.apply(batch)
        for job, task_id in batch.sends:  # committed: the messages may leave now
            run.send(job, task_id)
        acted = acted or bool(batch.moves or batch.sends)
        if run.broker_down is not None and handle == run.lost_message:
            return False  # nothing more can be sent: the next pass sends them
        if len(jobs) < limit:
            return acted
        after = sweep.after(jobs[-1])
