"""Whether a job's history is a path through the move table (``states.MOVES``).

The history records only the moves whose ``recorded`` flag is set; the others (the
happy path's publish, claim and success, a replay, a heartbeat, an outbox send) happen
between its rows without a trace. So a history
is legal when each row is a move the table allows, and each row starts from a state the
previous row ended in, or one reachable from it through unrecorded moves; the job's
current state is reachable from the last row the same way. A row of a move that no
longer records is judged like any other: histories written by earlier versions stay
legal. The chaos suite, the
model-based test and the demo check every history with ``path_errors``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from .states import MOVES, State


class Line(NamedTuple):
    """One history row, as the ``Transition`` model stores it."""

    event: str
    from_state: str | None
    to_state: str


def _silent_steps() -> dict[State | None, frozenset[State | None]]:
    """Per state, the states reachable from it through unrecorded moves (itself included)."""
    step: dict[State | None, set[State | None]] = {s: {s} for s in [None, *State]}
    for m in MOVES.values():
        if not m.recorded:
            for source in m.sources:
                step[source].add(source if m.target is None else m.target)
    reach: dict[State | None, frozenset[State | None]] = {}
    for start in step:
        seen, todo = {start}, [start]
        while todo:
            for nxt in step[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        reach[start] = frozenset(seen)
    return reach


_SILENT = _silent_steps()


def _state(value: str | None) -> State | None:
    return None if value in (None, "") else State(value)


def path_errors(lines: Iterable[Line | tuple[str, str | None, str]],
                current: str | None) -> list[str]:
    """Why the history ``lines`` (oldest first) ending in state ``current`` is not a path
    through the move table; empty when it is."""
    errors: list[str] = []
    at: State | None = None
    for number, raw in enumerate(lines, 1):
        line = Line(*raw)
        move = MOVES.get(line.event)
        source, target = _state(line.from_state), _state(line.to_state)
        if move is None:
            errors.append(f"line {number}: no move named {line.event!r}")
        elif source not in move.sources or target != (move.target or source):
            errors.append(f"line {number}: {line.event} does not go from {source} to {target}")
        if source not in _SILENT[at]:
            errors.append(f"line {number}: starts from {source}, but the job was in {at}")
        at = target
    if _state(current) not in _SILENT[at]:
        errors.append(f"the job is {current}, not reachable from {at}")
    return errors
