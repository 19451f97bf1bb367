"""What a job-store backend does, and the values that cross its boundary.

A backend performs each protocol step as one conditional write that also appends the
history row, and reports honestly whether the write matched. The PostgreSQL backend does
each step in one round trip; the generic one uses the ORM and works on any database.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from .. import states
from ..errors import InvalidTransition
from ..states import State

if TYPE_CHECKING:
    from django.db.models import Q

    from ..models import Job

#: Job columns a transition may set besides ``state`` and ``updated_at``.
SETTABLE = frozenset(
    {"result", "error", "lease_expires_at", "not_before", "finished_at", "worker", "task_id",
     "dispatch_count", "started_at"}
)
JSON_COLUMNS = frozenset({"result", "error", "args", "kwargs", "options"})


def checked_target(event: str, from_state: State, values: dict[str, Any]) -> State:
    """The target of move ``event`` from ``from_state``; raise if the table forbids it."""
    move = states.move(event)
    if from_state not in move.sources or move.target is None:
        raise InvalidTransition(f"move {event!r} does not start from {from_state}")
    unknown = set(values) - SETTABLE
    if unknown:
        raise InvalidTransition(f"move {event!r} cannot set {sorted(unknown)}")
    return move.target


def claim_reason(event: str) -> str:
    """The history reason of a claim move."""
    return "the previous attempt's lease had expired" if event == "taken_over" else ""


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

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> JobRow:
        return cls(**{**values, "state": State(values["state"])})


#: Columns of JobRow, in order, for SELECT lists.
ROW_COLUMNS = ("id", "state", "attempt", "fingerprint", "task_id", "lease_expires_at",
               "not_before", "result", "error")


@dataclass(frozen=True)
class BatchMove:
    """One conditional move of a batch: ``event`` from ``from_state`` while the job holds
    ``attempt``, setting ``values``; ``worker``, ``task_id`` and ``reason`` go in history."""

    job_id: int
    event: str
    from_state: State
    attempt: int
    values: dict[str, Any]
    worker: str = ""
    task_id: str = ""
    reason: str = ""


@dataclass(frozen=True)
class ClaimOutcome:
    """``won``: the claimant now holds ``row.attempt``. Else ``row`` is what stood in the way
    (None: no row, which cannot last since claim inserts one)."""

    won: bool
    row: JobRow | None


class Backend(Protocol):
    """The job store. Every method is one protocol step on the backend's database alias."""

    alias: str

    def publish(self, intent: Intent, task_id: str, now: datetime) -> ClaimOutcome:
        """Insert the PENDING intent unless the key exists.

        ``won``: this call inserted it. Else ``row`` is the existing row (the caller checks
        its fingerprint), or None in the rare race where a concurrent insert is not yet
        visible; the claim resolves that.
        """

    def claim(self, intent: Intent, claimant: Claimant) -> ClaimOutcome:
        """Claim the key: PENDING (or no row) -> RUNNING with attempt + 1; RUNNING whose
        lease expired -> RUNNING with attempt + 1. A lost claim on a finished key records a
        ``duplicate`` history row and returns the row to replay."""

    def transition(
        self, job_id: int, event: str, from_state: State, *, attempt: int | None,
        values: dict[str, Any], now: datetime, worker: str = "", task_id: str = "",
        reason: str = "", actor: str = "",
    ) -> bool:
        """Move job ``job_id`` by the move ``event`` if it is in ``from_state`` (and holds
        ``attempt`` when given), setting ``values``; append the history row. Returns
        whether the row matched."""

    def record(
        self, job_id: int, event: str, state: State, attempt: int, *, now: datetime,
        worker: str = "", task_id: str = "", reason: str = "",
    ) -> None:
        """Append a history row that changes no state."""

    def heartbeat(self, job_id: int, attempt: int, lease_expires_at: datetime,
                  now: datetime) -> bool:
        """Extend the lease of attempt ``attempt``; False if it no longer holds the claim."""

    # -- recovery (celery_idem.reaper) -------------------------------------------------

    def locked_batch(self, condition: Q, after_id: int,
                     limit: int) -> AbstractContextManager[list[Job]]:
        """Open one short transaction and yield up to ``limit`` jobs matching ``condition``
        with ``id > after_id``, by id, locked against concurrent recovery passes (rows
        another pass holds are skipped where the database can). Transitions made inside
        the block commit with it."""

    def transition_batch(self, moves: list[BatchMove], now: datetime) -> set[int]:
        """Make each move as ``transition`` would, as few statements as the database
        allows; return the ids of the jobs that moved."""

    def mark_redispatched(self, job_id: int, attempt: int, dispatch_count: int, *,
                          task_id: str, now: datetime, reason: str) -> bool:
        """Record that PENDING job ``job_id`` was sent again as ``task_id``: bump its
        dispatch count and append a ``redispatched`` history row. False if the row moved
        on meanwhile (claimed, or re-sent by another pass: ``attempt`` and
        ``dispatch_count`` no longer match)."""

    # -- the admin ---------------------------------------------------------------------

    def task_names(self, limit: int) -> list[str]:
        """The distinct task names of the jobs, in order, at most ``limit``."""
