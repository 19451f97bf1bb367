"""A job row read as Django's ``TaskResult``: the status, the return value, the error,
one worker id per attempt, and the times.

The job row is the result store: ``CeleryIdemBackend.get_result``, the ``TaskResult`` an
``enqueue()`` returns and the one Django's task signals carry are all read here, so they
say the same thing. The result id is the job's primary key and a digest of its key
(``"412-3f9a0c1d2e4b"``): the same for every enqueue of a key for as long as its job
exists, and never another key's, although SQLite gives the id of a row that rolled back
to the next row it inserts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.tasks import TaskResult, TaskResultStatus
from django.tasks.base import TaskError

from ..conf import settings
from ..errors import Uncertain
from ..models import Job, Transition
from ..states import State

#: Each job state as Django's status. UNCERTAIN and EXPIRED are FAILED: neither runs again
#: by itself, neither has a return value, and each carries an error that says which it is
#: (an operator's retry or resolution moves the job on, and a refreshed result with it).
STATUS: dict[str, TaskResultStatus] = {
    State.PENDING: TaskResultStatus.READY,
    State.RUNNING: TaskResultStatus.RUNNING,
    State.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    State.FAILED: TaskResultStatus.FAILED,
    State.EXPIRED: TaskResultStatus.FAILED,
    State.UNCERTAIN: TaskResultStatus.FAILED,
}
#: What ``build`` reads of a job row.
COLUMNS = ("id", "namespace", "key", "task_name", "state", "attempt", "worker", "args",
           "kwargs", "result", "error", "created_at", "started_at", "finished_at",
           "updated_at")


@dataclass(frozen=True)
class Attempts:
    """What the job's history adds to its row: the worker of each attempt, the first
    attempt's start, and the reason of the move to UNCERTAIN."""

    workers: dict[int, str]
    first_start: datetime | None
    uncertain_reason: str = ""


#: Hex digits of the key's digest in a result id.
DIGEST_LENGTH = 12


def result_id(job: dict[str, Any]) -> str:
    """The result id of the job row ``job``."""
    return f"{job['id']}-{_digest(job['namespace'], job['key'])}"


def _digest(namespace: str, key: str) -> str:
    return hashlib.sha256(f"{namespace}\0{key}".encode()).hexdigest()[:DIGEST_LENGTH]


def read_result(given: Any) -> dict[str, Any] | None:
    """The row of the job the result id ``given`` names, or None (no such job, or not
    a result id)."""
    job_id = str(given).partition("-")[0]
    if not (job_id.isascii() and job_id.isdigit() and len(job_id) < 20):
        return None
    job = read(int(job_id))
    return job if job is not None and result_id(job) == given else None


def read(job_id: int) -> dict[str, Any] | None:
    """The job's row (``COLUMNS``), or None."""
    return (Job.objects.using(settings.DATABASE).filter(id=job_id).values(*COLUMNS)
            .first())


def read_key(namespace: str, key: str) -> dict[str, Any] | None:
    """The row of the job of ``key`` in ``namespace``, or None."""
    return (Job.objects.using(settings.DATABASE).filter(namespace=namespace, key=key)
            .values(*COLUMNS).first())


#: What ``attempts`` reads of each history line: (event, attempt, worker, the start of
#: the attempt it ended, reason).
Line = tuple[str, int, str, datetime | None, str]


def history(job: dict[str, Any]) -> list[Line]:
    """The job's history lines, read only when its row cannot say alone what a result
    needs (more than one attempt, an attempt whose worker the row no longer holds,
    UNCERTAIN's reason)."""
    if job["attempt"] <= 1 and job["worker"] and job["state"] != State.UNCERTAIN:
        return []
    return list(Transition.objects.using(settings.DATABASE).filter(job_id=job["id"])
                .order_by("at", "id").values_list("event", "attempt", "worker",
                                                  "attempt_started_at", "reason"))


def attempts(job: dict[str, Any], lines: list[Line]) -> Attempts:
    """The attempts of the job row ``job`` with its history ``lines``."""
    workers: dict[int, str] = {}
    starts = [job["started_at"]] if job["started_at"] else []
    reason = ""
    for event, attempt, worker, started, why in lines:
        # Each line names the attempt it was written under and that attempt's worker (a
        # take-over's, the new attempt's); a line without a worker (a re-send) says nothing.
        if worker and attempt:
            workers.setdefault(attempt, worker)
        if started:
            starts.append(started)
        if event == "uncertain":
            reason = why
    if job["worker"] and job["attempt"]:
        workers.setdefault(job["attempt"], job["worker"])
    return Attempts(workers, min(starts, default=None), reason)


def errors(job: dict[str, Any], said: Attempts) -> list[TaskError]:
    """The job's error as Django's: its exception class path and traceback."""
    state = job["state"]
    if state == State.UNCERTAIN:
        path = f"{Uncertain.__module__}.{Uncertain.__qualname__}"
        why = said.uncertain_reason or "its worker was lost during the body"
        return [TaskError(exception_class_path=path, traceback=f"{path}: {why}\n")]
    error = job["error"]
    if not error or state not in (State.FAILED, State.EXPIRED):
        return []
    path = f"{error.get('module', 'builtins')}.{error.get('type', 'Exception')}"
    text = error.get("traceback") or f"{path}: {error.get('message', '')}\n"
    return [TaskError(exception_class_path=path, traceback=text)]


def build(task: Any, alias: str, job: dict[str, Any],
          lines: list[Line] | None = None) -> TaskResult:
    """The ``TaskResult`` of ``task`` (a declaration of the backend ``alias``) that the
    job row ``job`` says; ``lines``: its history (default: read when needed)."""
    said = attempts(job, history(job) if lines is None else lines)
    state = job["state"]
    finished = job["finished_at"]
    if state == State.UNCERTAIN:
        finished = job["updated_at"]  # when it became UNCERTAIN: nothing ends it later
    result = TaskResult(
        task=task,
        id=result_id(job),
        status=STATUS[state],
        enqueued_at=job["created_at"],
        started_at=said.first_start,
        finished_at=finished if STATUS[state] in (TaskResultStatus.SUCCESSFUL,
                                                  TaskResultStatus.FAILED) else None,
        last_attempted_at=job["started_at"],
        args=job["args"] or [],
        kwargs=job["kwargs"] or {},
        backend=alias,
        errors=errors(job, said),
        worker_ids=[said.workers.get(n, "") for n in range(1, job["attempt"] + 1)],
    )
    if state == State.SUCCEEDED:
        object.__setattr__(result, "_return_value", job["result"])
    return result
