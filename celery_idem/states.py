"""The job state machine, as data: every move with its guard and what it writes.

``MOVES`` is the one table of allowed writes. A move names the states it starts from,
the state it ends in (None: the state stays as it is), the row conditions that guard it
(``Guard``), whether it is fenced by the attempt its writer holds, the columns it may
set, whether it appends a history row, and whether it ends an attempt (its history row
then keeps that attempt's start). The backends render a move as a conditional
statement (SQL on PostgreSQL, ORM filters elsewhere) and refuse what the table does not
allow (``backends.base.Backend``); nothing else writes a job row.

The predicates a guard stands for ("claimable", "lease expired") are defined here once,
for Python (``lease_expired``) and for querysets (``stale_q``); the PostgreSQL backend's
SQL renders the same guard flags (``backends/postgresql.sql``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from .errors import InvalidTransition


class State(enum.StrEnum):
    """A job's state. A plain string enum (not Django's TextChoices), so type checkers
    know its members; ``STATE_CHOICES`` gives the model field its choices."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    UNCERTAIN = "UNCERTAIN"
    #: Its message expired before any worker claimed it; never sent again automatically.
    EXPIRED = "EXPIRED"

    @property
    def label(self) -> Promise:
        """The state's name for people, translated."""
        return _LABELS[self]


_LABELS: dict[State, Promise] = {
    State.PENDING: _("Pending"), State.RUNNING: _("Running"),
    State.SUCCEEDED: _("Succeeded"), State.FAILED: _("Failed"),
    State.UNCERTAIN: _("Uncertain"), State.EXPIRED: _("Expired"),
}
#: The model field's choices.
STATE_CHOICES = [(state.value, _LABELS[state]) for state in State]


class Guard(enum.Flag):
    """Row conditions a move needs besides its source state."""

    NONE = 0
    #: The row holds the attempt the writer holds (the fencing token).
    FENCED = enum.auto()
    #: The row's arguments have the caller's fingerprint.
    SAME_ARGUMENTS = enum.auto()
    #: Not scheduled for later: no not-before, or it passed, or the claimant is the
    #: scheduled message itself (same task id).
    CLAIMABLE = enum.auto()
    #: A RUNNING row's lease has expired: its worker is presumed dead.
    LEASE_EXPIRED = enum.auto()
    #: The dispatch count is the one the writer saw (of two recovery passes, one wins).
    SAME_DISPATCH = enum.auto()


@dataclass(frozen=True)
class Move:
    """One allowed write. See the module docstring."""

    event: str
    sources: frozenset[State | None]
    target: State | None
    guard: Guard
    sets: frozenset[str]
    label: Promise
    #: Whether the move appends a row to the job's history.
    recorded: bool = True
    #: Whether the move is announced (``signals.transition`` and its log line), recorded
    #: or not: every move but a lease extension and the outbox's sent mark.
    announced: bool = True
    #: Columns the move always writes with the same value, as (column, value) pairs:
    #: a ``Change`` of the move carries them without its writer naming them.
    marks: tuple[tuple[str, object], ...] = ()
    #: Whether the move ends the attempt that holds the claim (a take-over: the attempt it
    #: takes over). A recorded one keeps that attempt's start in its history row
    #: (``Transition.attempt_started_at``: the job row's ``started_at`` as it was before
    #: the move), since the next claim overwrites the row's; the one that is not recorded
    #: (a success) ends the key's last attempt, whose start the row keeps.
    ends_attempt: bool = False

    @property
    def records_start(self) -> bool:
        """Whether the move's history row keeps the start of the attempt it ends."""
        return self.recorded and self.ends_attempt

    def starts_from(self, state: State | None) -> bool:
        return state in self.sources

    def source_values(self) -> list[str]:
        """The source states by value, sorted (for a ``state IN (...)`` guard)."""
        return sorted(s.value for s in self.sources if s is not None)


P, R, S, F, U = State.PENDING, State.RUNNING, State.SUCCEEDED, State.FAILED, State.UNCERTAIN
X = State.EXPIRED
_ALL = frozenset(State)

#: What a claim writes (the attempt is incremented, not set).
CLAIM_COLUMNS = frozenset({"attempt", "worker", "task_id", "lease_expires_at", "not_before",
                           "started_at"})
#: What the producer writes with the intent.
INTENT_COLUMNS = frozenset({"namespace", "key", "task_name", "args", "kwargs", "fingerprint",
                            "options", "task_id", "created_at", "parent", "message",
                            "not_before", "expires_at", "sent_at"})
_ENDS = frozenset({"finished_at", "lease_expires_at"})
#: What a move that sends the job's message again writes besides its own columns.
RESEND_COLUMNS = frozenset({"task_id", "dispatch_count", "sent_at"})


def _m(event: str, sources: set[State | None] | frozenset[State | None],
       target: State | None, guard: Guard, sets: set[str] | frozenset[str], label: Promise,
       recorded: bool = True, announced: bool = True, marks: dict[str, object] | None = None,
       ends_attempt: bool = False) -> Move:
    marks = marks or {}
    return Move(event, frozenset(sources), target, guard, frozenset(sets) | set(marks), label,
                recorded, announced, tuple(sorted(marks.items())), ends_attempt)


_FENCED, _NONE = Guard.FENCED, Guard.NONE

#: Every allowed write, by the event name the history records.
MOVES: dict[str, Move] = {m.event: m for m in [
    # The happy path (published, claimed, succeeded) records no history: the job row
    # holds when it was created, started and finished, its attempt and its worker, and
    # the admin's timeline shows them from there (issue 11: a fresh task writes its row,
    # not three history rows). What the row cannot hold is recorded: the moves that end
    # an attempt otherwise than by success keep its start (``ends_attempt``).
    _m("published", {None}, P, _NONE, INTENT_COLUMNS, _("published"), recorded=False),
    # A worker won the claim; from None when the producer's intent is missing.
    _m("claimed", {P, None}, R, Guard.SAME_ARGUMENTS | Guard.CLAIMABLE,
       CLAIM_COLUMNS | INTENT_COLUMNS, _("claimed"), recorded=False),
    # An optimistic atomic body's commit (``atomic="optimistic"``): the body ran with no
    # claim, and its last statement inserts the key's row already finished, attempt 1,
    # unless the key has a row (then its transaction rolls back: ``runner.Run.optimistic``).
    _m("committed", {None}, S, _NONE, CLAIM_COLUMNS | INTENT_COLUMNS | _ENDS | {"result"},
       _("succeeded without a claim"), recorded=False),
    _m("taken_over", {R}, R, Guard.SAME_ARGUMENTS | Guard.CLAIMABLE | Guard.LEASE_EXPIRED,
       CLAIM_COLUMNS, _("taken over"), ends_attempt=True),
    _m("heartbeat", {R}, R, _FENCED, {"lease_expires_at"}, _("lease extended"),
       recorded=False, announced=False),
    # The body replaced itself (self.replace): the claim waits, with no lease and no
    # worker, for its replacement's last step to commit the outcome; never run again.
    _m("replaced", {R}, R, _FENCED, {"lease_expires_at", "worker"},
       _("handed to its replacement")),
    _m("succeeded", {R}, S, _FENCED, _ENDS | {"result"}, _("succeeded"), recorded=False,
       ends_attempt=True),
    _m("failed", {R}, F, _FENCED, _ENDS | {"error"}, _("failed"), ends_attempt=True),
    # The retry's own message (its envelope) replaces the one a re-send would send; a
    # retry with new arguments (self.retry(args=..., kwargs=...)) moves them too.
    _m("retry_scheduled", {R}, P, _FENCED, {"not_before", "lease_expires_at", "message",
                                            "expires_at", "fingerprint", "args", "kwargs"},
       _("retry scheduled"), ends_attempt=True),
    # Stale claim, worker lost, worker shut down, or an operator.
    _m("released", {R}, P, _FENCED, {"lease_expires_at", "worker"} | RESEND_COLUMNS,
       _("released"), ends_attempt=True),
    # The flag marks the FAILED jobs an operator looks for (the admin's filter,
    # idem_status, idem_retry --reason dead-lettered) in the row, not in its history.
    # From PENDING it ends no attempt (one already ended); the start it keeps is the
    # row's, as ever: that attempt's, which the line that ended it kept too.
    _m("dead_lettered", {R, P}, F, _FENCED, _ENDS | {"error", "sent_at"}, _("dead-lettered"),
       marks={"dead_lettered": True}, ends_attempt=True),
    # Lost mid-run, and the task must not re-run blindly: an operator decides.
    _m("uncertain", {R}, U, _FENCED, {"lease_expires_at", "worker"}, _("outcome uncertain"),
       ends_attempt=True),
    # Its message expired unclaimed (Celery dropped it, or `expires` passed).
    _m("expired", {P}, X, _FENCED, _ENDS | {"error"}, _("expired")),
    _m("reset", {F, U, X}, P, _FENCED,
       _ENDS | {"error", "not_before"} | RESEND_COLUMNS, _("reset by an operator"),
       marks={"dead_lettered": False}),
    _m("resolved", {U}, S, _FENCED, _ENDS | {"error"}, _("resolved by an operator")),
    # The state stays. A replay of a finished key is a read: it writes nothing (it is
    # still announced, like every move but the two below that only touch a timestamp).
    _m("duplicate", {S, F, X}, None, Guard.SAME_ARGUMENTS, set(), _("duplicate replayed"),
       recorded=False),
    # History only: the state stays.
    _m("late_finish", _ALL, None, _NONE, set(), _("late finish ignored")),
    _m("redispatched", {P}, None, _FENCED | Guard.SAME_DISPATCH, RESEND_COLUMNS,
       _("sent again")),
    _m("attempt_lost", {P}, None, _FENCED, set(), _("attempt lost")),
    # A step of the body stored its checkpoint (backends: ``save_step``).
    _m("step_completed", {R}, None, _FENCED, set(), _("step completed")),
    # An outbox's message left after the commit; a sent one did not leave (unsent.py).
    _m("sent", {P}, None, _FENCED, {"sent_at"}, _("sent"), recorded=False, announced=False),
    _m("send_failed", {P}, None, _FENCED | Guard.SAME_DISPATCH, RESEND_COLUMNS - {"task_id"},
       _("message not sent")),
]}

#: The history-only move a body's stored step records (``Backend.save_step``).
STEP_COMPLETED = "step_completed"


class StepWrite(enum.Enum):
    """What ``Backend.save_step`` did. FENCED: the writer's attempt no longer owns the job."""

    STORED, EXISTS, FENCED = "stored", "exists", "fenced"


#: Allowed (from, to) pairs, derived from MOVES.
TRANSITIONS: dict[State | None, frozenset[State]] = {
    source: frozenset(
        m.target for m in MOVES.values() if source in m.sources and m.target is not None
    )
    for source in [None, *State]
}

#: States whose outcome a duplicate replays instead of running.
FINISHED: frozenset[State] = frozenset({S, F, X})
#: States an operator may forget a job in: a RUNNING job's worker still writes to its
#: row, so its claim is released first.
FORGETTABLE: frozenset[State] = _ALL - {R}


def move(event: str) -> Move:
    """The move called ``event``; an unknown name is a programming error."""
    try:
        return MOVES[event]
    except KeyError:
        raise InvalidTransition(f"no move named {event!r}") from None


def applies(event: str, state: State | str | None) -> bool:
    """Whether move ``event`` may start from ``state`` (admin buttons, command choices)."""
    return (State(state) if state is not None else None) in move(event).sources


def check(source: State | str | None, target: State | str | None) -> None:
    """Raise InvalidTransition unless some move goes from ``source`` to ``target``."""
    if target is None:
        return
    src = State(source) if source is not None else None
    if State(target) not in TRANSITIONS[src]:
        raise InvalidTransition(f"transition {src} -> {target} is not allowed")


# -- the predicates behind the guards ----------------------------------------------------

def lease_expired(state: str, lease_expires_at: datetime | None, now: datetime) -> bool:
    """RUNNING past its lease: the worker that holds the claim is presumed dead."""
    return state == R and lease_expires_at is not None and lease_expires_at < now


def stale_q(now: datetime) -> Q:
    """``lease_expired`` as a queryset filter."""
    return Q(state=R, lease_expires_at__lt=now)


def never_sent_q() -> Q:
    """An intent written in a transaction whose message never left: not marked sent and
    never claimed (a claim can beat the mark; the message then certainly left)."""
    return Q(sent_at__isnull=True, attempt=0)


def live_q(now: datetime) -> Q:
    """RUNNING within its lease."""
    return Q(state=R, lease_expires_at__gte=now)


def claimable(not_before: datetime | None, task_id: str, now: datetime,
              claimant_task_id: str) -> bool:
    """Not held back by a retry scheduled for later, unless the claimant is that retry."""
    return not_before is None or not_before <= now or task_id == claimant_task_id


def claimable_q(now: datetime, claimant_task_id: str) -> Q:
    """``claimable`` as a queryset filter."""
    return Q(not_before__isnull=True) | Q(not_before__lte=now) | Q(task_id=claimant_task_id)


def guard_q(move: Move, *, now: datetime, attempt: int | None = None,
            fingerprint: str = "", task_id: str = "", dispatch_count: int | None = None) -> Q:
    """The row conditions of ``move`` as a queryset filter (the portable rendering)."""
    q = Q()
    if Guard.FENCED in move.guard:
        q &= Q(attempt=attempt)
    if Guard.SAME_ARGUMENTS in move.guard:
        q &= Q(fingerprint=fingerprint)
    if Guard.CLAIMABLE in move.guard:
        q &= claimable_q(now, task_id)
    if Guard.LEASE_EXPIRED in move.guard:
        q &= stale_q(now)
    if Guard.SAME_DISPATCH in move.guard:
        q &= Q(dispatch_count=dispatch_count)
    return q


# -- the table as documentation (docs/explanation/how-it-works.md, checked by a test) ---

def markdown_table() -> str:
    """The move table rendered as Markdown."""
    def name(state: State | None) -> str:
        return "(none)" if state is None else state.value

    lines = ["| event | from | to | guard | writes | history |",
             "| --- | --- | --- | --- | --- | --- |"]
    for m in MOVES.values():
        sources = ", ".join(sorted(name(s) for s in m.sources))
        target = "(unchanged)" if m.target is None else m.target.value
        guard = ", ".join(g.name.lower() for g in Guard if g and g in m.guard
                          and g.name is not None) or "-"
        marked = dict(m.marks)
        writes = sorted(m.sets - set(marked)) + [f"{c} = {v!r}" for c, v in m.marks]
        lines.append(f"| {m.event} | {sources} | {target} | {guard} | "
                     f"{', '.join(writes) or '-'} | {_history_cell(m)} |")
    return "\n".join(lines) + "\n"


def _history_cell(m: Move) -> str:
    if m.records_start:
        return "yes, with the start of the attempt it ends"
    return "yes" if m.recorded else "no"
