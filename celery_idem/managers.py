"""Queries over jobs that the reaper, the admin and the commands share."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Exists, OuterRef
from django.utils import timezone

from .states import State, stale_q


class JobQuerySet(models.QuerySet):
    def stale(self, now: datetime | None = None) -> JobQuerySet:
        """RUNNING jobs whose lease has expired: their worker is presumed dead."""
        return self.filter(stale_q(now or timezone.now()))

    def dead_lettered(self) -> JobQuerySet:
        """FAILED jobs given up on after max_attempts (a ``dead_lettered`` history row).
        Driven from those history rows (few, in a partial index on PostgreSQL), not from
        the FAILED jobs: IN rather than EXISTS, which PostgreSQL ran job by job."""
        history = self.model._meta.get_field("transitions").related_model
        rows = history.objects.filter(event="dead_lettered").values("job_id")
        return self.filter(pk__in=rows, state=State.FAILED)

    def not_dead_lettered(self) -> JobQuerySet:
        """Every job but the dead-lettered ones."""
        return self.exclude(self._dead_letter_row(), state=State.FAILED)

    def _dead_letter_row(self) -> Exists:
        # EXISTS rather than a join with DISTINCT: it keeps the newest-first index usable.
        # The history model is reached through the relation, not imported: models.py
        # imports this module.
        history = self.model._meta.get_field("transitions").related_model
        return Exists(history.objects.filter(job=OuterRef("pk"), event="dead_lettered"))
