"""``manage.py idem_reap``: run one recovery pass now and print what it did."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from celery_idem.conf import settings
from celery_idem.recovery import reap

from ._filters import positive


class Command(BaseCommand):
    help = ("Run one recovery pass: release stale claims (re-dispatch, dead-letter or mark "
            "uncertain) and re-dispatch PENDING jobs whose message was lost.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=None,
                            help="rows per transaction (default CELERY_IDEM_REAPER_BATCH_SIZE)")
        parser.add_argument("--database", default=None,
                            help="database alias (default CELERY_IDEM_DATABASE)")

    def handle(self, *args: Any, **options: Any) -> None:
        batch_size = positive(options["batch_size"], "--batch-size")
        report = reap(using=options["database"] or settings.DATABASE,
                             batch_size=batch_size)
        lines = report.lines()
        if not lines:
            self.stdout.write("Nothing to do: no stale claims and no lost messages.")
            return
        for line in lines:
            self.stdout.write(line)
