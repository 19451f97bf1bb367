"""The values that cross the job store's boundary, and the check of a move against the
table (``check_change``). Pure data: no database access here."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .. import states
from ..errors import InvalidTransition
from ..states import Move, State

#: Columns whose values are JSON.
JSON_COLUMNS = frozenset({"result", "error", "args", "kwargs", "options", "message"})
#: Of those, the ones stored as written (``fields.OrderedJSONField``: ``json`` on
#: PostgreSQL, not ``jsonb``).
ORDERED_JSON_COLUMNS = frozenset({"result"})


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
    #: The job whose claimed body sent this one (the parent -> child link), if any.
    parent_id: int | None = None


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
#: Where ROW_COLUMNS has a JSON column: ``row_from_tuple`` parses those by position (a
#: set intersection and two dict copies per returned row cost more than the parse).
_JSON_AT = tuple(i for i, col in enumerate(ROW_COLUMNS) if col in JSON_COLUMNS)
_STATE_AT = ROW_COLUMNS.index("state")
#: State by value: a dict lookup, where ``State(value)`` goes through Enum's machinery.
_STATES = {state.value: state for state in State}


def json_text(value: Any) -> str | None:
    """A JSON column's value as the SQL backends send it: text, or NULL for None."""
    return None if value is None else json.dumps(value)


def row_from_tuple(values: tuple[Any, ...] | list[Any], *, won: bool = False) -> JobRow:
    """A JobRow from a raw cursor's ROW_COLUMNS, whose JSON columns come back as text
    (the SQL backends' statements: Django parses JSONField in Python, not the driver).

    ``won``: the row of a claim or an intent that won, whose caller reads its id, state
    and attempt only: its result, error and arguments are left out (None), not parsed
    (two JSON documents a fresh task's claim and intent each spent a third of their
    Python on)."""
    if len(values) != len(ROW_COLUMNS):
        raise ValueError(f"a job row has {len(ROW_COLUMNS)} columns, not {len(values)}")
    row = list(values)
    for i in _JSON_AT:
        if won:
            row[i] = None
        elif isinstance(row[i], (str, bytes)):
            row[i] = json.loads(row[i])
    # As JobRow.from_values, without its copy (an unknown value still raises there).
    row[_STATE_AT] = _STATES.get(row[_STATE_AT]) or State(row[_STATE_AT])
    return JobRow(*row)  # ROW_COLUMNS are its fields, in order (tests/unit/test_values.py)


def holds(row: JobRow | None, claimant: Claimant) -> bool:
    """Whether ``row`` is as ``claimant``'s claim left it: a claim read back after its
    UPDATE committed (no UPDATE ... RETURNING) lost if another claim got in between."""
    return (row is not None and row.state is State.RUNNING and row.task_id == claimant.task_id
            and row.lease_expires_at == claimant.lease_expires_at)


@dataclass(frozen=True)
class ClaimOutcome:
    """``won``: the claimant now holds ``row.attempt`` (a won row's result, error and
    arguments are not read back: None). Else ``row`` is what stood in the way (None: no
    row yet). ``recorded``: a lost claim appended the ``duplicate`` line."""

    won: bool
    row: JobRow | None
    recorded: bool = False


@dataclass(frozen=True)
class Change:
    """One move asked of a known job: ``event`` from ``from_state``, setting ``values``.

    The guard values the move needs come with it: ``attempt`` for a fenced move (the
    attempt the writer holds), ``fingerprint`` and ``dispatch_count`` where the move is
    guarded by them. ``worker``, ``task_id``, ``reason`` and ``actor`` go in the history;
    ``task_name`` (the job's task, where the writer knows it) only in the announcement.
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
    task_name: str = ""

    def __post_init__(self) -> None:
        # The values the move always writes (``Move.marks``) travel with every change of
        # it, so no writer has to know them and no backend renders them on its own.
        m = states.MOVES.get(self.event)
        if m is not None and m.marks:
            object.__setattr__(self, "values", {**dict(m.marks), **self.values})

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


#: An optimistic atomic body's commit: the key's row inserted finished (``commit_new``).
COMMITTED = "committed"
#: The claim moves, and the move a lost claim records when the key is already finished.
CLAIM_MOVES = frozenset({"claimed", "taken_over"})
DUPLICATE = "duplicate"
#: The history reason of a lost claim on a finished key.
DUPLICATE_REASON = "replayed the stored outcome"
