"""A job's timeline on its admin page: the history rows merged with the job row's moments,
and its attempts, one line each.

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


def attempts(job: Job, transitions: Iterable[Transition]) -> list[dict[str, Any]]:
    """Each attempt of ``job``, oldest first: when it started, its worker, when and how it
    ended. The row holds the last claim's start and a success; the history holds every
    other end, each with the start of the attempt it ended (``attempt_started_at``: of
    the attempt before its own for a take-over, which also starts one). Where that row
    does not say (the backends always write it), the start is None."""
    runs: dict[int, dict[str, Any]] = {n: {"attempt": n, "started": None, "worker": "",
                                           "ended": None, "event": "", "to": None,
                                           "reason": ""}
                                       for n in range(1, job.attempt + 1)}
    for t in transitions:
        if t.attempt_started_at is not None:
            ended = runs.get(t.attempt - 1 if t.event in _CLAIMS else t.attempt)
            if ended is not None:
                ended["started"] = ended["started"] or t.attempt_started_at
        run = runs.get(t.attempt)
        if run is None:
            continue
        if t.event == "taken_over":
            run.update(started=run["started"] or t.at, worker=t.worker)
            before = runs.get(t.attempt - 1)
            if before is not None and before["ended"] is None:  # its claim was taken over
                before.update(ended=t.at, event=t.event, to=State.RUNNING)
        elif t.from_state == State.RUNNING and t.to_state != State.RUNNING:
            run.update(ended=t.at, event=t.event, to=t.to_state, reason=t.reason,
                       worker=run["worker"] or t.worker)
    last = runs.get(job.attempt)
    if last is not None:
        last["started"] = job.started_at or last["started"]
        last["worker"] = last["worker"] or job.worker
        if last["ended"] is None and job.state == State.SUCCEEDED and job.finished_at:
            last.update(ended=job.finished_at, event="succeeded", to=State.SUCCEEDED)
    return [{**run, "started": display.full_time(run["started"]) if run["started"] else "",
             "ran": _ran(run["started"], run["ended"]),
             "ended": display.full_time(run["ended"]) if run["ended"] else "",
             "event": EVENT_LABELS.get(run["event"], run["event"]),
             "to": display.state_badge(run["to"]) if run["to"] else "",
             "running": run["ended"] is None and run["attempt"] == job.attempt
             and job.state == State.RUNNING}
            for run in runs.values()]


def _ran(started: datetime | None, ended: datetime | None) -> str:
    return display.short_duration((ended - started).total_seconds()) if started and ended else ""
