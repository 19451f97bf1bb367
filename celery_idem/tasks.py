"""celery-idem's own Celery task: the recovery pass, for beat to run periodically.

Found by ``app.autodiscover_tasks()`` as ``celery_idem.tasks``. The name is fixed, so a
schedule (``celery_idem.beat``) and a worker agree on it whatever the project's layout.
"""

from __future__ import annotations

from celery import shared_task

from .recovery import reap

#: The registered name of the recovery task.
RELEASE_STALE_CLAIMS = "celery_idem.release_stale_claims"


@shared_task(name=RELEASE_STALE_CLAIMS, ignore_result=False)
def release_stale_claims() -> dict[str, dict[str, int]]:
    """One recovery pass (celery_idem.recovery.reap); returns what it did, per task."""
    return reap().as_dict()
