"""The job state machine, as data.

``MOVES`` is the one table of allowed transitions. Every write to a job's state names a
move from it; the backends turn the move's sources into the ``WHERE state IN (...)`` guard
of a conditional UPDATE, so a write that the table does not allow cannot be expressed,
and a write that matches no row lost a race and says so.
"""

from __future__ import annotations

from typing import NamedTuple

from django.db import models
from django.utils.translation import gettext_lazy as _

from .errors import InvalidTransition


class State(models.TextChoices):
    PENDING = "PENDING", _("Pending")
    RUNNING = "RUNNING", _("Running")
    SUCCEEDED = "SUCCEEDED", _("Succeeded")
    FAILED = "FAILED", _("Failed")
    UNCERTAIN = "UNCERTAIN", _("Uncertain")


class Move(NamedTuple):
    """An allowed transition: from any of ``sources`` (None: no row yet) to ``target``.

    A move whose target is None changes no state: it is only recorded in the history
    (a duplicate replayed, a fenced-out attempt finishing late).
    """

    sources: frozenset[State | None]
    target: State | None


def _move(sources: set[State | None], target: State | None) -> Move:
    return Move(frozenset(sources), target)


P, R, S, F, U = State.PENDING, State.RUNNING, State.SUCCEEDED, State.FAILED, State.UNCERTAIN

#: Every allowed transition, by the event name that the history records.
MOVES: dict[str, Move] = {
    "published": _move({None}, P),  # the producer wrote the intent
    "claimed": _move({P, None}, R),  # a worker won the claim (None: the intent was missing)
    "taken_over": _move({R}, R),  # a claim whose lease had expired was taken by a new attempt
    "succeeded": _move({R}, S),
    "failed": _move({R}, F),
    "retry_scheduled": _move({R}, P),  # self.retry / autoretry: claim again later
    "released": _move({R}, P),  # stale claim, worker lost, revoked, or an operator
    "dead_lettered": _move({R, P}, F),  # attempts reached max_attempts
    "uncertain": _move({R}, U),  # lost mid-run, and the task must not re-run blindly
    "reset": _move({F, U}, P),  # an operator retries a failed or uncertain job
    "resolved": _move({U}, S),  # an operator marks an uncertain job succeeded
    "duplicate": _move({S, F}, None),  # a duplicate message replayed the outcome
    "late_finish": _move({P, R, S, F, U}, None),  # a fenced-out attempt finished late
    "redispatched": _move({P}, None),  # recovery sent a PENDING job's message again
    "attempt_lost": _move({P}, None),  # a worker died before its claim committed (atomic)
}

#: Allowed (from, to) pairs, derived from MOVES.
TRANSITIONS: dict[State | None, frozenset[State]] = {
    source: frozenset(
        m.target for m in MOVES.values() if source in m.sources and m.target is not None
    )
    for source in [None, *State]
}

#: States whose outcome a duplicate replays instead of running.
FINISHED: frozenset[State] = frozenset({S, F})


def move(name: str) -> Move:
    """Return the move called ``name``; an unknown name is a programming error."""
    try:
        return MOVES[name]
    except KeyError:
        raise InvalidTransition(f"no move named {name!r}") from None


def check(source: State | str | None, target: State | str | None) -> None:
    """Raise InvalidTransition unless the table allows ``source`` -> ``target``."""
    src = State(source) if source is not None else None
    if target is None:
        return
    if State(target) not in TRANSITIONS[src]:
        raise InvalidTransition(f"transition {src} -> {target} is not allowed")


def sources(name: str) -> list[str]:
    """The states a row must be in for the move called ``name`` (for a WHERE guard)."""
    return sorted(s.value for s in move(name).sources if s is not None)
