"""How many jobs each task has in each state, cheaply at millions of rows.

An exact ``GROUP BY`` over the whole job table reads every row (2.7 s at 5M rows on
PostgreSQL, growing linearly). The states an operator acts on are rare (PENDING, RUNNING,
FAILED, UNCERTAIN, EXPIRED): they are counted exactly, from a small partial index that
holds only them (``celery_idem_job_census_idx``, an index-only scan). SUCCEEDED, the bulk,
is estimated on PostgreSQL from the planner's statistics (the table's row count and each
task name's frequency, refreshed by autovacuum's ANALYZE), labelled ``exact=False``.
``exact=True`` counts everything. Other databases (MariaDB, SQLite) count exactly: their
statistics give no per-value frequencies to estimate from.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import NamedTuple

from django.db.models import Count, Q

from .backends import get_backend
from .conf import settings
from .models import Job
from .states import State

#: The state estimated rather than counted; every other state is counted exactly.
BULK = State.SUCCEEDED
#: The row holding the SUCCEEDED estimate of the tasks the statistics do not name.
OTHER_TASKS = "(other tasks)"


class JobCount(NamedTuple):
    task_name: str
    state: str
    count: int  # type: ignore[assignment]  # the name agreed with the metrics; shadows tuple.count
    #: False where ``count`` is the planner's estimate, not a count.
    exact: bool


def job_counts(*, exact: bool = False, using: str | None = None) -> list[JobCount]:
    """Jobs per (task, state), sorted; exact for every state but SUCCEEDED where the
    database keeps statistics to estimate it from (PostgreSQL), unless ``exact``."""
    using = using or settings.DATABASE
    jobs = Job.objects.using(using)
    statistics = None if exact else get_backend(using).task_name_statistics()
    if statistics is None:
        return _grouped(jobs.all(), exact=True)
    rare = _grouped(jobs.filter(~Q(state=BULK)), exact=True)
    return sorted(rare + _bulk_estimate(*statistics, rare))


def _grouped(jobs: object, *, exact: bool) -> list[JobCount]:
    # COUNT(*), not COUNT(id): the id is not in the census index, so counting it would
    # read every row's heap page (0.9 s at 10M jobs instead of 30 ms).
    rows = (jobs.values_list("task_name", "state")  # type: ignore[attr-defined]
            .annotate(n=Count("*")).order_by())
    return sorted(JobCount(task, state, n, exact) for task, state, n in rows)


def _bulk_estimate(rows: float, shares: dict[str, float],
                   rare: list[JobCount]) -> list[JobCount]:
    """SUCCEEDED per task: the estimated rows of each task (``rows`` x the task name's
    share) less its exact rare ones; what no share covers goes to the tasks the
    statistics do not name, or to ``OTHER_TASKS``."""
    rare_per_task = Counter[str]()
    for count in rare:
        rare_per_task[count.task_name] += count.count
    bulk_total = max(0, round(rows) - sum(rare_per_task.values()))
    estimates = {name: max(0, round(rows * share) - rare_per_task[name])
                 for name, share in shares.items()}
    rest = bulk_total - sum(estimates.values())
    unnamed = sorted(set(rare_per_task) - set(estimates))
    if rest > 0:
        for name in unnamed or [OTHER_TASKS]:
            estimates[name] = rest // max(1, len(unnamed))
    return [JobCount(name, BULK.value, n, False) for name, n in estimates.items() if n > 0]


class RunningAtomic(NamedTuple):
    """What ``running_atomic`` found."""

    #: The jobs, oldest transaction first where the database says when it started.
    jobs: list[HeldJob]
    #: False where the database cannot tell (SQLite): ``jobs`` is empty, not known empty.
    visible: bool


class HeldJob(NamedTuple):
    id: int
    namespace: str
    key: str
    task_name: str
    #: The attempts committed before this one (the running claim is not committed yet).
    attempt: int
    #: When the body's transaction started (PostgreSQL), else None.
    since: datetime | None


#: The most jobs ``running_atomic`` reports (and, on MySQL/MariaDB, PENDING rows it probes).
RUNNING_ATOMIC_LIMIT = 1000


def running_atomic(*, using: str | None = None, ids: list[int] | None = None,
                   limit: int = RUNNING_ATOMIC_LIMIT) -> RunningAtomic:
    """The ``atomic=True`` jobs running right now, which their rows do not show: an atomic
    body's claim commits with the body, so until then the row reads PENDING at its last
    committed attempt. The open transactions' row locks show them (``Backend
    .held_pending``: on PostgreSQL the rows an open transaction updated, on MySQL/MariaDB
    the rows a SKIP LOCKED read passes over); nothing is written. ``ids``: only among
    these jobs (a page of the admin). Not visible on SQLite, whose one writer's lock names
    no rows, nor where the claim inserted the row (no intent was written: broker
    durability, or a key whose intent was lost) until it commits."""
    using = using or settings.DATABASE
    if ids is not None and not ids:
        return RunningAtomic([], True)
    held = get_backend(using).held_pending(ids, limit)
    if held is None:
        return RunningAtomic([], False)
    since = dict(held)
    rows = Job.objects.using(using).filter(id__in=since).values_list(
        "id", "namespace", "key", "task_name", "attempt")
    jobs = [HeldJob(job_id, namespace, key, task, attempt, since[job_id])
            for job_id, namespace, key, task, attempt in rows]
    jobs.sort(key=lambda job: (job.since is None, job.since or datetime.min, job.id))
    return RunningAtomic(jobs, True)


def with_running_atomic(counts: list[JobCount], running: RunningAtomic) -> list[JobCount]:
    """``counts`` with each running atomic job counted RUNNING instead of PENDING."""
    moved = Counter(job.task_name for job in running.jobs)
    if not moved:
        return counts
    by_key = {(c.task_name, c.state): c for c in counts}
    for task, n in moved.items():
        pending = by_key.get((task, State.PENDING.value))
        if pending is not None:
            by_key[(task, State.PENDING.value)] = pending._replace(count=max(0, pending.count - n))
        claimed = by_key.get((task, State.RUNNING.value))
        by_key[(task, State.RUNNING.value)] = JobCount(
            task, State.RUNNING.value, (claimed.count if claimed else 0) + n, True)
    return sorted(c for c in by_key.values() if c.count or c.state != State.PENDING.value)


__all__ = ["HeldJob", "JobCount", "RunningAtomic", "job_counts", "running_atomic",
           "with_running_atomic"]
