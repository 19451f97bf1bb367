"""Queries over jobs that the reaper, the admin and the commands share."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Q
from django.utils import timezone

from .states import State, stale_q


class JobQuerySet(models.QuerySet):
    def stale(self, now: datetime | None = None) -> JobQuerySet:
        """RUNNING jobs whose lease has expired: their worker is presumed dead."""
        return self.filter(stale_q(now or timezone.now()))

    def dead_lettered(self) -> JobQuerySet:
        return self.filter(dead_lettered_q())

    def not_dead_lettered(self) -> JobQuerySet:
        return self.exclude(dead_lettered_q())


def dead_lettered_q() -> Q:
    """FAILED jobs given up on: their attempts ran out, or their message could not be
    delivered (the ``dead_lettered`` move sets the flag, an operator's reset clears it).
    The state is named too, so the partial index on both serves it alone."""
    return Q(state=State.FAILED, dead_lettered=True)
