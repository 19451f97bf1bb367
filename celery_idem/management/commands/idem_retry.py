"""``manage.py idem_retry``: reset FAILED (or UNCERTAIN) jobs to PENDING and send them again."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q

from celery_idem import actions, states
from celery_idem.conf import settings
from celery_idem.models import Job
from celery_idem.states import State

from ._filters import positive, task_filter, text_filter


class Command(BaseCommand):
    help = ("Reset FAILED jobs (or UNCERTAIN ones, with --state) to PENDING and dispatch "
            "them again. A reset job gets a fresh max_attempts budget.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--task", help="only jobs of this task name")
        parser.add_argument("--key-prefix", help="only keys that start with this")
        parser.add_argument("--reason", help="only jobs whose failure reason contains this "
                                             "(case-insensitive), e.g. dead-lettered")
        parser.add_argument("--state", choices=states.move("reset").source_values(),
                            default=State.FAILED, help="which jobs to reset (default FAILED)")
        parser.add_argument("--all", action="store_true",
                            help="retry every matching job even without a filter")
        parser.add_argument("--limit", type=int, default=None, help="at most this many jobs")
        parser.add_argument("--note", default="", help="why, recorded in each job's history")
        parser.add_argument("--clear-steps", action="store_true",
                            help="delete each job's step checkpoints, so every step runs "
                                 "again (default: completed steps are kept and skipped)")
        parser.add_argument("--dry-run", action="store_true",
                            help="list the jobs that would be retried, change nothing")
        parser.add_argument("--database", default=None,
                            help="database alias (default CELERY_IDEM_DATABASE)")

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"] or settings.DATABASE
        jobs = self.select(options, using)
        if options["dry_run"]:
            for job in jobs:
                self.stdout.write(f"would retry job {job.pk} {job.namespace}:{job.key} "
                                  f"({job.task_name}, attempt {job.attempt})")
            self.stdout.write(f"{len(jobs)} job(s) would be retried (dry run).")
            return
        actor = f"idem_retry ({getpass.getuser()})"
        retried = 0
        for job in jobs:
            result = actions.retry(job, actor=actor, note=options["note"],
                                   clear_steps=options["clear_steps"])
            if not result.done:
                self.stderr.write(f"skipped job {job.pk} {job.namespace}:{job.key}: "
                                  f"{result.outcome.value.replace('_', ' ')}")
                continue
            retried += 1
            sent = f"sent as task {result.task_id}" if result.task_id else \
                f"not sent ({result.dispatch_error}); the reaper sends it later"
            self.stdout.write(f"retried job {job.pk} {job.namespace}:{job.key}: {sent}")
        self.stdout.write(f"{retried} job(s) retried.")

    def select(self, options: dict[str, Any], using: str) -> list[Job]:
        prefix = text_filter(options["key_prefix"], "--key-prefix")
        reason = text_filter(options["reason"], "--reason")
        limit = positive(options["limit"], "--limit")
        condition = task_filter(options["task"], using)
        if prefix:
            condition &= Q(key__startswith=prefix)
        if reason:
            condition &= Q(id__in=Job.objects.using(using).filter(
                transitions__to_state=options["state"], transitions__reason__icontains=reason,
            ).values("id"))
        if not condition and not options["all"]:
            raise CommandError("refusing to retry every job without a filter: pass --task, "
                               "--key-prefix or --reason, or --all")
        jobs = (Job.objects.using(using).filter(condition, state=options["state"])
                .order_by("id"))
        return list(jobs[:limit] if limit else jobs)
