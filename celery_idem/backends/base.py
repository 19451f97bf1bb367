"""The job store: what every backend does, and the values that cross its boundary.

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
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import states
from ..errors import InvalidTransition
from ..signals import announce
from ..states import Move, State

if TYPE_CHECKING:
    from django.db.models import Q

    from ..models import Job

#: Columns whose values are JSON.
JSON_COLUMNS = frozenset({"result", "error", "args", "kwargs", "options", "message"})


@dataclass(frozen=True)
class Intent:
    """What the producer asks for: run ``task_name`` once for (namespace, key)."""

    namespace: str
    key: str
    task_name: str
    fingerprint: str
    args: list[Any] | None
    kwargs: dict[str, Any] | None
    options: dict[str, Any] = field(default_factory=dict)
    #: The envelope of the message (``celery_idem.envelope``), when it was captured.
    message: dict[str, Any] | None = None
    #: The message's ETA (the job is not due before it) and expiry.
    not_before: datetime | None = None
    expires_at: datetime | None = None
    #: False for an intent written in a transaction whose message leaves on commit.
    sent: bool = True


@dataclass(frozen=True)
class Claimant:
    """The attempt that asks for a claim."""

    worker: str
    task_id: str
    now: datetime
    lease_expires_at: datetime


@dataclass(frozen=True)
class JobRow:
    """A job row as a claim or a publish found it."""

    id: int
    state: State
    attempt: int
    fingerprint: str
    task_id: str = ""
    lease_expires_at: datetime | None = None
    not_before: datetime | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> JobRow:
        return cls(**{**values, "state": State(values["state"])})


#: Columns of JobRow, in order, for SELECT lists.
ROW_COLUMNS = ("id", "state", "attempt", "fingerprint", "task_id", "lease_expires_at",
               "not_before", "result", "error", "args", "kwargs")


@dataclass(frozen=True)
class ClaimOutcome:
    """``won``: the claimant now holds ``row.attempt``. Else ``row`` is what stood in the
    way (None: no row yet). ``recorded``: a lost claim appended the ``duplicate`` line."""

    won: bool
    row: JobRow | None
    recorded: bool = False


@dataclass(frozen=True)
class Change:
    """One move asked of a known job: ``event`` from ``from_state``, setting ``values``.

    The guard values the move needs come with it: ``attempt`` for a fenced move (the
    attempt the writer holds), ``fingerprint`` and ``dispatch_count`` where the move is
    guarded by them. ``worker``, ``task_id``, ``reason`` and ``actor`` go in the history.
    ``attempt`` is also the history's attempt for a move that does not change the row.
    """

    job_id: int
    event: str
    from_state: State | None
    attempt: int | None = None
    values: Mapping[str, Any] = field(default_factory=dict)
    worker: str = ""
    task_id: str = ""
    reason: str = ""
    actor: str = ""
    fingerprint: str = ""
    dispatch_count: int | None = None

    @property
    def move(self) -> Move:
        return states.move(self.event)

    @property
    def to_state(self) -> State:
        target = self.move.target or self.from_state
        assert target is not None, "a move from no row has a target"
        return target


def check_change(change: Change) -> Move:
    """The move of ``change``, if the table allows it as asked; else InvalidTransition."""
    m = change.move
    if not m.starts_from(change.from_state):
        raise InvalidTransition(f"move {m.event!r} does not start from {change.from_state}")
    unknown = set(change.values) - m.sets
    if unknown:
        raise InvalidTransition(f"move {m.event!r} cannot set {sorted(unknown)}")
    if states.Guard.FENCED in m.guard and change.attempt is None:
        raise InvalidTransition(f"move {m.event!r} is fenced: it needs the attempt")
    if states.Guard.SAME_DISPATCH in m.guard and change.dispatch_count is None:
        raise InvalidTransition(f"move {m.event!r} needs the dispatch count it saw")
    return m


#: The claim moves, and the move a lost claim records when the key is already finished.
CLAIM_MOVES = frozenset({"claimed", "taken_over"})
DUPLICATE = "duplicate"


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
                     task_id=task_id)
        return outcome

    def claim(self, event: str, intent: Intent, claimant: Claimant,
              reason: str = "") -> ClaimOutcome:
        """Make the claim move ``event`` on ``intent``'s key: from PENDING (``claimed``) or
        from a RUNNING row whose lease expired (``taken_over``), attempt + 1.

        A claim that loses to a finished row with the same arguments records the
        ``duplicate`` line in the same write. ``claimed`` on a missing row inserts it
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
                     claimant.worker, claimant.task_id, reason)
        elif outcome.recorded and row is not None and states.move(DUPLICATE).recorded:
            announce(self.alias, row.id, DUPLICATE, row.state, row.state, row.attempt,
                     claimant.worker, claimant.task_id, DUPLICATE_REASON)
        return outcome

    def claim_new(self, intent: Intent, claimant: Claimant, reason: str) -> ClaimOutcome:
        """Insert the key's row already claimed (attempt 1), unless it exists (then the
        existing row comes back, not won)."""
        outcome = self._insert(states.move("claimed"), intent, claimant.now,
                               task_id=claimant.task_id, claimant=claimant, reason=reason)
        if outcome.won and outcome.row is not None:
            announce(self.alias, outcome.row.id, "claimed", None, State.RUNNING, 1,
                     claimant.worker, claimant.task_id, reason)
        return outcome

    def apply(self, change: Change, now: datetime) -> bool:
        """Make ``change`` if its row still matches the move's guard; append its history
        line. Returns whether the row matched (False: it lost a race)."""
        m = check_change(change)
        attempt = self._apply(change, m, now)
        if attempt is None:
            return False
        if m.recorded:
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
            if change.job_id in moved and change.move.recorded:
                self._announce(change, change.attempt or 0)
        return moved

    def _announce(self, change: Change, attempt: int) -> None:
        announce(self.alias, change.job_id, change.event, change.from_state, change.to_state,
                 attempt, change.worker, change.task_id, change.reason, change.actor)

    # -- what a subclass renders ---------------------------------------------------------

    @abstractmethod
    def _insert(self, move: Move, intent: Intent, now: datetime, *, task_id: str,
                claimant: Claimant | None = None, reason: str = "") -> ClaimOutcome:
        """Insert the key's row in ``move.target`` (claimed by ``claimant`` when given)
        with its history line, unless the key exists: then return the existing row."""

    @abstractmethod
    def _claim(self, move: Move, source: State, intent: Intent, claimant: Claimant,
               reason: str) -> ClaimOutcome:
        """The conditional claim of the key's row from ``source`` under ``move.guard``;
        lost to a row that the ``duplicate`` move's guard accepts, record that line."""

    @abstractmethod
    def _apply(self, change: Change, move: Move, now: datetime) -> int | None:
        """Make ``change`` under ``move``'s guard; the row's attempt if it matched."""

    def _apply_batch(self, changes: list[Change], now: datetime) -> set[int]:
        return {c.job_id for c in changes if self._apply(c, c.move, now) is not None}

    # -- reads ---------------------------------------------------------------------------

    @abstractmethod
    def locked_batch(self, condition: Q, after_id: int,
                     limit: int) -> AbstractContextManager[list[Job]]:
        """Open one short transaction and yield up to ``limit`` jobs matching ``condition``
        with ``id > after_id``, by id, locked against concurrent recovery passes (rows
        another pass holds are skipped where the database can). Changes applied inside
        the block commit with it."""

    @abstractmethod
    def attempts_since_reset(self, job_id: int, attempt: int) -> int:
        """How many of the job's ``attempt`` claims count against max_attempts: those
        since an operator last reset it (all of them if never). The attempt number is a
        fencing token and never goes back, so a reset job gets a fresh budget this way."""

    @abstractmethod
    def task_names(self, limit: int) -> list[str]:
        """The distinct task names of the jobs, in order, at most ``limit``."""


#: The history reason of a lost claim on a finished key.
DUPLICATE_REASON = "replayed the stored outcome"
