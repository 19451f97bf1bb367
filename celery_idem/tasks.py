"""celery-idem's own Celery tasks: the recovery pass and the retention purge, for beat to
run periodically, and the last step of a replacement (``celery_idem.replacement``).

Found by ``app.autodiscover_tasks()`` as ``celery_idem.tasks``. The name is fixed, so a
schedule (``celery_idem.beat``) and a worker agree on it whatever the project's layout.
"""

from __future__ import annotations

import os
from typing import Any

from celery import shared_task

from . import claims, replacement, retention
from .recovery import reap

#: The registered name of the recovery task.
RELEASE_STALE_CLAIMS = "celery_idem.release_stale_claims"
#: The registered name of the retention task (celery_idem.beat.purge_schedule).
PURGE_FINISHED_JOBS = "celery_idem.purge_finished_jobs"


@shared_task(name=RELEASE_STALE_CLAIMS, ignore_result=False)
def release_stale_claims() -> dict[str, dict[str, int]]:
    """One recovery pass (celery_idem.recovery.reap); returns what it did, per task."""
    return reap().as_dict()


@shared_task(name=PURGE_FINISHED_JOBS, ignore_result=False)
def purge_finished_jobs(older_than_days: float | None = None,
                        batch_size: int = retention.DEFAULT_BATCH_SIZE) -> dict[str, int]:
    """Delete the jobs finished more than ``older_than_days`` ago (default
    CELERY_IDEM_RETENTION_DAYS), in short batches; returns the rows deleted per model."""
    before = retention.cutoff(older_than_days)
    return dict(retention.purge(retention.purgeable(before), batch_size=batch_size))


@shared_task(bind=True, name=replacement.REPLACED_TASK, ignore_result=False)
def replaced(self: Any, result: Any, alias: str, job_id: int, attempt: int) -> Any:
    """The last step of a replacement (``IdempotentTask.replace``): commit its result as
    the replaced key's outcome and return it unchanged."""
    worker = claims.worker_id(self.request.hostname, os.getpid())
    return replacement.finish(result, alias, job_id, attempt, worker, self.request.id or "")
