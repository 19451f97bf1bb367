"""Queries over jobs that the reaper, the admin and the commands share."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Exists, OuterRef
from django.utils import timezone

from .states import State


class JobQuerySet(models.QuerySet):
    def stale(self, now: datetime | None = None) -> JobQuerySet:
        """RUNNING jobs whose lease has expired: their worker is presumed dead."""
        return self.filter(state=State.RUNNING, lease_expires_at__lt=now or timezone.now())

    def dead_lettered(self) -> JobQuerySet:
        """FAILED jobs given up on after max_attempts (a ``dead_lettered`` history row)."""
        return self.filter(_dead_letter_row(), state=State.FAILED)

    def not_dead_lettered(self) -> JobQuerySet:
        """Every job but the dead-lettered ones."""
        return self.exclude(_dead_letter_row(), state=State.FAILED)


def _dead_letter_row() -> Exists:
    # EXISTS rather than a join with DISTINCT: it keeps the newest-first index usable.
    from .models import Transition

    return Exists(Transition.objects.filter(job=OuterRef("pk"), event="dead_lettered"))
