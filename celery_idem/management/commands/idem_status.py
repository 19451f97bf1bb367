"""``manage.py idem_status``: what the job table holds, and what needs attention."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db.models import Count, Q
from django.utils import timezone

from celery_idem.census import (
    HeldJob,
    JobCount,
    job_counts,
    running_atomic,
    with_running_atomic,
)
from celery_idem.conf import settings
from celery_idem.managers import dead_lettered_q
from celery_idem.models import Job
from celery_idem.recovery.due import lost_messages
from celery_idem.states import State, stale_q

from ._filters import task_filter


def _age(since: datetime | None, now: datetime) -> str:
    if since is None:
        return "-"
    seconds = int((now - since).total_seconds())
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    return f"{sign}{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Command(BaseCommand):
    help = ("Show job counts per task and state, the oldest running claim, stale claims, "
            "lost messages, dead-lettered and uncertain jobs.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--task", help="only jobs of this task name")
        parser.add_argument("--json", action="store_true", help="print JSON (for scripts)")
        parser.add_argument("--exact", action="store_true",
                            help="count SUCCEEDED jobs exactly (reads the whole table); "
                                 "by default PostgreSQL estimates them from its statistics")
        parser.add_argument("--database", default=None,
                            help="database alias (default CELERY_IDEM_DATABASE)")

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"] or settings.DATABASE
        now = timezone.now()
        jobs = Job.objects.using(using).filter(task_filter(options["task"], using))
        running = running_atomic(using=using)
        counts = [c for c in with_running_atomic(
                  job_counts(exact=options["exact"], using=using), running)
                  if options["task"] is None or c.task_name == options["task"]]
        atomic = [job for job in running.jobs
                  if options["task"] is None or job.task_name == options["task"]]
        status = self.status(jobs, counts, now, atomic if running.visible else None)
        if options["json"]:
            self.stdout.write(json.dumps(status, indent=2, default=str))
        else:
            self.print_status(status, now)

    def status(self, jobs: Any, census: list[JobCount], now: datetime,
               atomic: list[HeldJob] | None = None) -> dict[str, Any]:
        """Everything the command shows, as JSON-ready data. ``atomic``: the running
        atomic jobs (counted RUNNING in ``census`` already), None where not visible."""
        counts: dict[str, dict[str, int]] = defaultdict(dict)
        for count in census:
            counts[count.task_name][count.state] = count.count
        oldest = (jobs.filter(state=State.RUNNING).order_by("started_at", "id")
                  .values("id", "namespace", "key", "task_name", "attempt", "worker",
                          "started_at", "lease_expires_at").first())
        held = atomic[0] if atomic else None
        if held is not None and (oldest is None or held.since is not None and (
                oldest["started_at"] is None or held.since < oldest["started_at"])):
            # Its claim is in the body's transaction: the attempt it runs is the next one.
            oldest = {"id": held.id, "namespace": held.namespace, "key": held.key,
                      "task_name": held.task_name, "attempt": held.attempt + 1,
                      "worker": None, "started_at": held.since, "lease_expires_at": None,
                      "atomic": True}

        def per_task(*conditions: Q) -> dict[str, int]:
            """Jobs per task under any of ``conditions`` (disjoint: each one query, the
            range of one index). COUNT(*), not of a column: an index-only read."""
            found: Counter[str] = Counter()
            for condition in conditions:
                rows = jobs.filter(condition).values("task_name").annotate(n=Count("*"))
                found.update({row["task_name"]: row["n"] for row in rows.order_by()})
            return dict(found)

        return {
            "counts": dict(sorted(counts.items())),
            # (task, state) pairs whose count is the planner's estimate, not a count.
            "estimated": sorted([c.task_name, c.state] for c in census if not c.exact),
            "oldest_running": oldest,
            # Running atomic jobs per task (their rows read PENDING until the body
            # commits); None where the database cannot tell (SQLite).
            "running_atomic": None if atomic is None else dict(
                Counter(job.task_name for job in atomic)),
            "stale_claims": per_task(stale_q(now)),
            "lost_messages": per_task(*(lost.condition for lost in lost_messages(now))),
            "dead_lettered": per_task(dead_lettered_q()),
            "uncertain": per_task(Q(state=State.UNCERTAIN)),
            "expired": per_task(Q(state=State.EXPIRED)),
        }

    def print_status(self, status: dict[str, Any], now: datetime) -> None:
        out = self.stdout.write
        states = [s.value for s in State]
        width = max([len("task"), *(len(t) for t in status["counts"])])
        out(f"{'task':<{width}}  " + "  ".join(f"{s:>9}" for s in states))
        estimated = {tuple(pair) for pair in status["estimated"]}

        def cell(task: str, state: str, n: int) -> str:
            return f"~{n}" if (task, state) in estimated else str(n)

        for task, by_state in status["counts"].items():
            out(f"{task:<{width}}  " + "  ".join(
                f"{cell(task, s, by_state.get(s, 0)):>9}" for s in states))
        if not status["counts"]:
            out("(no jobs)")
        if estimated:
            out("~ estimated from PostgreSQL's statistics (as of the last ANALYZE); "
                "--exact counts them")
        oldest = status["oldest_running"]
        if oldest and oldest.get("atomic"):
            out(f"\nOldest running claim: job {oldest['id']} {oldest['namespace']}:"
                f"{oldest['key']} attempt {oldest['attempt']}, atomic, in its transaction "
                f"(committed with the body), running for {_age(oldest['started_at'], now)}")
        elif oldest:
            out(f"\nOldest running claim: job {oldest['id']} {oldest['namespace']}:"
                f"{oldest['key']} attempt {oldest['attempt']} on "
                f"{oldest['worker'] or 'unknown worker'}, running for "
                f"{_age(oldest['started_at'], now)}, lease expires in "
                f"{_age(now, oldest['lease_expires_at']) if oldest['lease_expires_at'] else '-'}")
        else:
            out("\nOldest running claim: none")
        atomic = status["running_atomic"]
        if atomic is None:
            out("Running atomic jobs: not visible on this database (they show PENDING "
                "until their body commits)")
        else:
            total = sum(atomic.values())
            detail = ", ".join(f"{t}: {n}" for t, n in sorted(atomic.items()))
            out(f"Running atomic jobs (in their transaction, counted RUNNING above): {total}"
                + (f" ({detail})" if total else ""))
        for label, name, hint in [
            ("Stale claims (lease expired)", "stale_claims", "idem_reap releases them"),
            ("Lost messages (PENDING past the dispatch timeout)", "lost_messages",
             "idem_reap re-dispatches them"),
            ("Dead-lettered", "dead_lettered", "idem_retry --reason dead-lettered"),
            ("Uncertain (an operator decides)", "uncertain",
             "resolve in the admin, or idem_retry --state UNCERTAIN"),
            ("Expired (message expired unclaimed)", "expired", "idem_retry --state EXPIRED"),
        ]:
            per_task = status[name]
            total = sum(per_task.values())
            detail = ", ".join(f"{t}: {n}" for t, n in sorted(per_task.items()))
            out(f"{label}: {total}" + (f" ({detail}) -> {hint}" if total else ""))
