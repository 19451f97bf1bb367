"""``manage.py idem_purge``: delete finished jobs and their history past a retention.

Deletes in batches, one short transaction each, so no lock is held for long. A purged
key is forgotten: publishing it again runs it again.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from celery_idem import retention
from celery_idem.conf import settings
from celery_idem.models import Job, Transition
from celery_idem.states import FINISHED

from ._filters import positive, task_filter

DEFAULT_BATCH_SIZE = retention.DEFAULT_BATCH_SIZE


class Command(BaseCommand):
    help = ("Delete SUCCEEDED and FAILED jobs, with their history and checkpoints, that "
            "finished more than --older-than days ago (default CELERY_IDEM_RETENTION_DAYS).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", type=float, default=None, metavar="DAYS",
                            help="retention in days (default CELERY_IDEM_RETENTION_DAYS)")
        parser.add_argument("--state", action="append", choices=sorted(FINISHED),
                            help="only this finished state (repeatable; default both)")
        parser.add_argument("--task", help="only jobs of this task name")
        parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                            help=f"jobs per transaction (default {DEFAULT_BATCH_SIZE})")
        parser.add_argument("--dry-run", action="store_true",
                            help="count what would be deleted, delete nothing")
        parser.add_argument("--database", default=None,
                            help="database alias (default CELERY_IDEM_DATABASE)")

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"] or settings.DATABASE
        positive(options["older_than"], "--older-than")
        batch_size = positive(options["batch_size"], "--batch-size")
        before = retention.cutoff(options["older_than"])
        # Only what the retention says: finished, and finished before the cutoff.
        condition = (retention.purgeable(before, options["state"])
                     & task_filter(options["task"], using))
        if options["dry_run"]:
            jobs = Job.objects.using(using).filter(condition)
            history = Transition.objects.using(using).filter(job__in=jobs).count()
            self.stdout.write(f"would delete {jobs.count()} job(s) and {history} history "
                              f"row(s) finished before {before:%Y-%m-%d %H:%M} (dry run).")
            return
        deleted = retention.purge(condition, using=using, batch_size=batch_size)
        self.stdout.write(f"deleted {deleted['job']} job(s), {deleted['transition']} history "
                          f"row(s) and {deleted['checkpoint']} checkpoint(s) finished before "
                          f"{before:%Y-%m-%d %H:%M}.")
