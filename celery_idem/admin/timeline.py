"""A job's timeline on its admin page: the history rows merged with the job row's moments.

The happy path records no history (``states.MOVES``: ``published``, ``claimed`` and
``succeeded`` are not recorded), because the job row already holds when it was created,
when its last claim started and when it finished, with the attempt and the worker. So the
timeline shows those moments from the row's own columns wherever no history row tells
them, marked as read from the row, merged in time order with the history rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from .. import states
from ..models import Job, Transition
from ..states import State
from . import display

#: How the history names each event: the move table's labels.
EVENT_LABELS = {event: move.label for event, move in states.MOVES.items()}
#: The moves that claim a key (the row's started_at is the last one's).
_CLAIMS = frozenset({"claimed", "taken_over"})


def timeline(job: Job, transitions: Iterable[Transition]) -> list[dict[str, Any]]:
    """The rows of ``job``'s timeline, oldest first."""
    lines = list(transitions)
    entries: list[tuple[datetime, int, dict[str, Any]]] = [
        (t.at, 1, _line(t.at, t.event, t.from_state, t.to_state, t.attempt, t.worker,
                        t.task_id, t.reason, t.actor))
        for t in lines]
    if job.created_at is not None and not any(t.from_state is None for t in lines):
        entries.append((job.created_at, 0, _line(
            job.created_at, "published", None, State.PENDING, 0, derived=True)))
    if job.started_at is not None and not any(
            t.event in _CLAIMS and t.at == job.started_at for t in lines):
        entries.append((job.started_at, 0, _line(
            job.started_at, "claimed", State.PENDING, State.RUNNING, job.attempt, job.worker,
            job.task_id, derived=True)))
    if (job.state == State.SUCCEEDED and job.finished_at is not None and not any(
            t.to_state == State.SUCCEEDED and t.at >= (job.started_at or t.at)
            for t in lines)):
        entries.append((job.finished_at, 2, _line(
            job.finished_at, "succeeded", State.RUNNING, State.SUCCEEDED, job.attempt,
            job.worker, job.task_id, derived=True)))
    entries.sort(key=lambda entry: (entry[0], entry[1]))
    return [row for _, _, row in entries]


def _line(at: datetime, event: str, from_state: str | None, to_state: str, attempt: int,
          worker: str = "", task_id: str = "", reason: str = "", actor: str = "",
          derived: bool = False) -> dict[str, Any]:
    return {
        "at": display.full_time(at), "event": EVENT_LABELS.get(event, event),
        "from": display.state_badge(from_state) if from_state else "",
        "to": display.state_badge(to_state),
        "changed": from_state != to_state, "attempt": attempt, "worker": worker,
        "task_id": task_id, "reason": reason, "actor": actor,
        # Read from the job row's columns, not from a history row.
        "derived": derived,
    }
