"""``manage.py idem_purge``: delete finished jobs and their history past a retention.

Deletes in batches, one short transaction each, so no lock is held for long. A purged
key is forgotten: publishing it again runs it again.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from celery_idem.conf import settings
from celery_idem.models import Job, Transition
from celery_idem.states import FINISHED

from ._filters import positive, task_filter

DEFAULT_BATCH_SIZE = 1000


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
        days = options["older_than"]
        days = settings.RETENTION_DAYS if days is None else days
        positive(days, "--older-than")
        batch_size = positive(options["batch_size"], "--batch-size")
        cutoff = timezone.now() - timedelta(days=days)
        # Only what the retention says: finished, and finished before the cutoff (rows
        # without finished_at, e.g. resolved by an operator, count from their last write).
        condition = (Q(state__in=options["state"] or sorted(FINISHED))
                     & (Q(finished_at__lt=cutoff)
                        | Q(finished_at__isnull=True, updated_at__lt=cutoff))
                     & task_filter(options["task"], using))
        jobs = Job.objects.using(using).filter(condition)
        if options["dry_run"]:
            history = Transition.objects.using(using).filter(job__in=jobs).count()
            self.stdout.write(f"would delete {jobs.count()} job(s) and {history} history "
                              f"row(s) finished before {cutoff:%Y-%m-%d %H:%M} (dry run).")
            return
        deleted = self.purge(jobs, condition, using, batch_size)
        self.stdout.write(f"deleted {deleted['job']} job(s), {deleted['transition']} history "
                          f"row(s) and {deleted['checkpoint']} checkpoint(s) finished before "
                          f"{cutoff:%Y-%m-%d %H:%M}.")

    def purge(self, jobs: Any, condition: Q, using: str, batch_size: int) -> Counter[str]:
        """Delete ``jobs`` by id, ``batch_size`` per transaction; return rows per model."""
        deleted: Counter[str] = Counter()
        after = 0
        while True:
            ids = list(jobs.filter(id__gt=after).order_by("id")
                       .values_list("id", flat=True)[:batch_size])
            if not ids:
                return deleted
            with transaction.atomic(using=using):
                # The condition again: a job reset between the read and the delete stays.
                _, per_model = Job.objects.using(using).filter(condition, id__in=ids).delete()
            for label, n in per_model.items():
                deleted[label.rsplit(".", 1)[-1].lower()] += n
            after = ids[-1]
