"""The job store: what every backend does (its values are in ``backends.values``).

``Backend`` holds the rules once. Each public method names a move of the state machine
(``celery_idem.states.MOVES``), refuses a write the table does not allow (wrong source
state, a column the move may not set, a fenced move without its attempt), asks the
subclass to render the move as one conditional write on its database, and announces
what was written (``celery_idem.signals.announce``). Subclasses only render: the
PostgreSQL backend as SQL statements (one round trip per step), the generic one through
the ORM, ``celery_idem.testing.InMemoryBackend`` in a dict. None of them decides.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import states
from ..errors import InvalidTransition
from ..signals import announce
from ..states import STEP_COMPLETED, Move, State, StepWrite
from .values import (
    CLAIM_MOVES,
    COMMITTED,
    DUPLICATE,
    DUPLICATE_REASON,
    Change,
    Claimant,
    ClaimOutcome,
    Intent,
    JobRow,
    check_change,
)

if TYPE_CHECKING:
    from django.db.models import Q

    from ..models import Job


def _replays(row: JobRow, intent: Intent) -> bool:
    """Whether a claim that lost to ``row`` is the ``duplicate`` move (a finished key with
    the caller's arguments: its outcome is replayed)."""
    return states.move(DUPLICATE).starts_from(row.state) and row.fingerprint == intent.fingerprint


class Backend(ABC):
    """The job store on one database alias. See the module docstring."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    # -- the protocol's steps ----------------------------------------------------------

    def publish(self, intent: Intent, task_id: str, now: datetime) -> ClaimOutcome:
        """Insert the PENDING intent unless the key exists.

        ``won``: this call inserted it. Else ``row`` is the existing row (the caller checks
        its fingerprint), or None in the rare race where a concurrent insert is not yet
        visible; the claim resolves that.
        """
        outcome = self._insert(states.move("published"), intent, now, task_id=task_id)
        if outcome.won and outcome.row is not None:
            announce(self.alias, outcome.row.id, "published", None, State.PENDING, 0,
                     task_id=task_id, task_name=intent.task_name)
        return outcome

    def publish_many(self, intents: list[tuple[Intent, str]],
                     now: datetime) -> list[ClaimOutcome]:
        """``publish`` for each (intent, task id), in one statement where the database
        allows; an outcome per intent, in order. A key that repeats in ``intents`` is
        inserted once, by its first intent: the later ones get its row, not won (their
        caller checks the fingerprint as against any existing row)."""
        first: dict[tuple[str, str], tuple[Intent, str]] = {}
        for intent, task_id in intents:
            first.setdefault((intent.namespace, intent.key), (intent, task_id))
        outcomes = self._insert_many(states.move("published"), list(first.values()), now)
        answered: list[ClaimOutcome] = []
        seen: set[tuple[str, str]] = set()
        for intent, task_id in intents:
            name = (intent.namespace, intent.key)
            outcome = outcomes.get(name, ClaimOutcome(False, None))
            if name in seen:
                outcome = ClaimOutcome(False, outcome.row)  # a repeat: the first's row
            elif outcome.won and outcome.row is not None:
                announce(self.alias, outcome.row.id, "published", None, State.PENDING, 0,
                         task_id=task_id)
            seen.add(name)
            answered.append(outcome)
        return answered

    def claim(self, event: str, intent: Intent, claimant: Claimant,
              reason: str = "") -> ClaimOutcome:
        """Make the claim move ``event`` on ``intent``'s key: from PENDING (``claimed``) or
        from a RUNNING row whose lease expired (``taken_over``), attempt + 1.

        A claim that loses to a finished row with the same arguments is the ``duplicate``
        move: announced, and recorded in the same write if the table says so (it does
        not: a replay only reads). ``claimed`` on a missing row inserts it
        already RUNNING (the producer's intent is missing).
        """
        if event not in CLAIM_MOVES:
            raise InvalidTransition(f"{event!r} is not a claim")
        m = states.move(event)
        source = next(s for s in m.sources if s is not None)
        outcome = self._claim(m, source, intent, claimant, reason)
        row = outcome.row
        if outcome.won and row is not None:
            announce(self.alias, row.id, event, source, State.RUNNING, row.attempt,
                     claimant.worker, claimant.task_id, reason, task_name=intent.task_name)
        elif row is not None and _replays(row, intent):
            self.replayed(row, intent, claimant.task_id, DUPLICATE_REASON, claimant.worker)
        return outcome

    def replayed(self, row: JobRow, intent: Intent, task_id: str, reason: str,
                 worker: str = "") -> None:
        """Announce the ``duplicate`` move: ``row``'s outcome answered a duplicate of
        ``intent`` (a claim that lost to it, or a publish the producer kept back:
        ``celery_idem.replays``). It writes nothing."""
        announce(self.alias, row.id, DUPLICATE, row.state, row.state, row.attempt, worker,
                 task_id, reason, task_name=intent.task_name)

    def claim_new(self, intent: Intent, claimant: Claimant, reason: str) -> ClaimOutcome:
        """Insert the key's row already claimed (attempt 1), unless it exists (then the
        existing row comes back, not won)."""
        outcome = self._insert(states.move("claimed"), intent, claimant.now,
                               task_id=claimant.task_id, claimant=claimant, reason=reason)
        if outcome.won and outcome.row is not None:
            announce(self.alias, outcome.row.id, "claimed", None, State.RUNNING, 1,
                     claimant.worker, claimant.task_id, reason, task_name=intent.task_name)
        return outcome

    def commit_new(self, intent: Intent, claimant: Claimant, result: Any,
                   finished_at: datetime) -> bool:
        """Insert the key's row already SUCCEEDED with ``result`` (attempt 1, by
        ``claimant``, whose ``now`` is when the body started): an optimistic atomic body's
        last write, the ``committed`` move. Whether it inserted: False when the key has a
        row, and then the caller's transaction must roll back."""
        m = states.move(COMMITTED)
        job_id = self._commit_new(m, intent, claimant, {"result": result,
                                                        "finished_at": finished_at})
        if job_id is None:
            return False
        announce(self.alias, job_id, COMMITTED, None, State.SUCCEEDED, 1, claimant.worker,
                 claimant.task_id, task_name=intent.task_name)
        return True

    def apply(self, change: Change, now: datetime, *, final: bool = False) -> bool:
        """Make ``change`` if its row still matches the move's guard; append its history
        line. Returns whether the row matched (False: it lost a race). ``final``: the
        last write of the caller's transaction (an atomic body's commit), which may
        commit with it (``_apply_final``); when it does not match, the transaction is
        left to roll back."""
        m = check_change(change)
        attempt = (self._apply_final if final else self._apply)(change, m, now)
        if attempt is None:
            return False
        if m.announced:
            self._announce(change, attempt)
        return True

    def apply_batch(self, changes: list[Change], now: datetime) -> set[int]:
        """Make each change as ``apply`` would, in as few statements as the database
        allows (recovery); return the ids of the jobs that moved."""
        for change in changes:
            if check_change(change).guard & ~states.Guard.FENCED:
                raise InvalidTransition(f"move {change.event!r} cannot be batched")
        moved = self._apply_batch(changes, now) if changes else set()
        for change in changes:
            if change.job_id in moved and change.move.announced:
                self._announce(change, change.attempt or 0)
        return moved

    def save_step(self, change: Change, step: str, value: Any, now: datetime) -> StepWrite:
        """Store checkpoint ``step`` = ``value`` fenced by ``change`` (a ``step_completed``
        move) with its history line, in one write; a step already stored stays as it is."""
        if change.event != STEP_COMPLETED:
            raise InvalidTransition(f"{change.event!r} does not store a step")
        m = check_change(change)
        outcome = self._save_step(change, step, value, now)
        if outcome is StepWrite.STORED and m.announced:
            self._announce(change, change.attempt or 0)
        return outcome

    def _announce(self, change: Change, attempt: int) -> None:
        # Every move is announced whether or not it records history (``Move.announced``):
        # the happy path's signals do not depend on its history rows.
        announce(self.alias, change.job_id, change.event, change.from_state, change.to_state,
                 attempt, change.worker, change.task_id, change.reason, change.actor,
                 change.task_name)

    def savepoint(self) -> AbstractContextManager[Any]:
        """A savepoint around a write in the caller's transaction: a database error in it
        rolls back to the savepoint, and the caller's transaction stays usable."""
        from django.db import transaction

        return transaction.atomic(using=self.alias)

    # -- what a subclass renders ---------------------------------------------------------

    @abstractmethod
    def _insert(self, move: Move, intent: Intent, now: datetime, *, task_id: str,
                claimant: Claimant | None = None, reason: str = "") -> ClaimOutcome:
        """Insert the key's row in ``move.target`` (claimed by ``claimant`` when given)
        with its history line, unless the key exists: then return the existing row."""

    @abstractmethod
    def _commit_new(self, move: Move, intent: Intent, claimant: Claimant,
                    ended: dict[str, Any]) -> int | None:
        """Insert the key's row finished as ``move`` says, attempt 1 by ``claimant``
        (started at its ``now``), with ``ended`` (its result and finished_at), in the
        caller's transaction, unless the key exists; the new row's id, or None."""

    def _insert_many(self, move: Move, intents: list[tuple[Intent, str]],
                     now: datetime) -> dict[tuple[str, str], ClaimOutcome]:
        """``_insert`` of each (intent, task id), keys distinct, by (namespace, key);
        one statement in the database backends, one at a time here."""
        return {(intent.namespace, intent.key): self._insert(move, intent, now, task_id=task_id)
                for intent, task_id in intents}

    @abstractmethod
    def _claim(self, move: Move, source: State, intent: Intent, claimant: Claimant,
               reason: str) -> ClaimOutcome:
        """The conditional claim of the key's row from ``source`` under ``move.guard``;
        lost to a row that the ``duplicate`` move's guard accepts, record that line."""

    @abstractmethod
    def _apply(self, change: Change, move: Move, now: datetime) -> int | None:
        """Make ``change`` under ``move``'s guard; the row's attempt if it matched."""

    def _apply_final(self, change: Change, move: Move, now: datetime) -> int | None:
        """``_apply`` as the transaction's last write; the transaction commits at its
        block's exit. PostgreSQL sends the COMMIT with it (``backends.pipeline``)."""
        return self._apply(change, move, now)

    @abstractmethod
    def _save_step(self, change: Change, step: str, value: Any, now: datetime) -> StepWrite:
        """Insert the checkpoint (and its history line) unless the guard fails or it exists."""

    @abstractmethod
    def read_step(self, job_id: int, step: str) -> tuple[bool, Any]:
        """(True, value) of a stored step of the job, else (False, None)."""

    @abstractmethod
    def clear_steps(self, job_id: int) -> int:
        """Delete the job's checkpoints (a retry from scratch); return how many."""

    def _apply_batch(self, changes: list[Change], now: datetime) -> set[int]:
        return {c.job_id for c in changes if self._apply(c, c.move, now) is not None}

    # -- reads ---------------------------------------------------------------------------

    def connection(self) -> Any:
        """The Django connection wrapper this backend writes on (closed and reopened when
        it drops: ``persistence.retrying``); None if it has none."""
        from django.db import connections

        return connections[self.alias]

    def state_of(self, job_id: int) -> tuple[State, int] | None:
        """The job's state and attempt as they are now (a retried commit checks whether
        its first try landed)."""
        from ..models import Job

        found = Job.objects.using(self.alias).filter(id=job_id).values_list(
            "state", "attempt").first()
        return None if found is None else (State(found[0]), int(found[1]))

    @abstractmethod
    def locked_batch(self, condition: Q, limit: int,
                     order: tuple[str, ...]) -> AbstractContextManager[list[Job]]:
        """Open one short transaction and yield up to ``limit`` jobs matching ``condition``
        in ``order``, locked against concurrent recovery passes (rows another pass holds
        are skipped where the database can). Changes applied inside the block commit
        with it."""

    def task_counts(self, condition: Q) -> dict[str, int]:
        """How many jobs match ``condition``, per task name (read, not locked)."""
        from django.db.models import Count

        from ..models import Job

        rows = (Job.objects.using(self.alias).filter(condition).values_list("task_name")
                .annotate(n=Count("id")).order_by())
        return {name: n for name, n in rows}

    @abstractmethod
    def attempts_since_reset(self, job_id: int, attempt: int) -> int:
        """How many of the job's ``attempt`` claims count against max_attempts: those
        since an operator last reset it (all of them if never). The attempt number is a
        fencing token and never goes back, so a reset job gets a fresh budget this way."""

    @abstractmethod
    def task_names(self, limit: int) -> list[str]:
        """The distinct task names of the jobs, in order, at most ``limit``."""

    def held_pending(self, ids: list[int] | None,
                     limit: int) -> list[tuple[int, datetime | None]] | None:
        """PENDING jobs whose row an open transaction holds: an atomic body's claim,
        which commits with the body (``census.running_atomic``). Up to ``limit`` of them,
        among ``ids`` if given, each with when its transaction started where the
        database says (else None). Takes no lock a worker waits for and leaves nothing
        on a session. None where the database cannot tell which rows are held (SQLite:
        its one writer's lock names no rows)."""
        return None

    def task_name_statistics(self) -> tuple[float, dict[str, float]] | None:
        """The planner's estimate of the job table's rows, and the share of them each
        frequent task name holds, where the database keeps such statistics (PostgreSQL,
        once the table was analysed); None elsewhere: count instead."""
        return None

