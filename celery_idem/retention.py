"""Retention: deleting finished jobs, their history and checkpoints, past an age.

Shared by ``manage.py idem_purge`` and the beat task ``celery_idem.purge_finished_jobs``
(``celery_idem.beat.purge_schedule``). Deletes by id in batches, one short transaction
each, so no lock is held for long and producers keep writing (the benchmark suite
``scale`` measures the worst concurrent insert during a purge). Two runs may overlap:
the second deletes what the first has not.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from .conf import settings
from .models import Job
from .states import FINISHED

DEFAULT_BATCH_SIZE = 1000


def cutoff(older_than_days: float | None = None) -> datetime:
    """The moment before which finished jobs go (default CELERY_IDEM_RETENTION_DAYS)."""
    days = settings.RETENTION_DAYS if older_than_days is None else older_than_days
    if days is None or days <= 0:
        raise ValueError(f"the retention must be more than 0 days, not {days!r}")
    return timezone.now() - timedelta(days=days)


def purgeable(before: datetime, states: list[str] | None = None) -> Q:
    """Finished (``states``, default both) before ``before``: rows without finished_at
    (resolved by an operator) count from their last write."""
    return (Q(state__in=states or sorted(FINISHED))
            & (Q(finished_at__lt=before) | Q(finished_at__isnull=True, updated_at__lt=before)))


def purge(condition: Q, *, using: str | None = None,
          batch_size: int = DEFAULT_BATCH_SIZE) -> Counter[str]:
    """Delete the jobs matching ``condition`` by id, ``batch_size`` per transaction;
    return the rows deleted per model (job, transition, checkpoint)."""
    using = using or settings.DATABASE
    jobs = Job.objects.using(using).filter(condition)
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


__all__ = ["DEFAULT_BATCH_SIZE", "cutoff", "purge", "purgeable"]
