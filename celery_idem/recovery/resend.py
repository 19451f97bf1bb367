"""Send a stored job's task again: its arguments, its key header, its original routing.

Used by recovery (stale claims, lost messages) and by operators (admin retry, idem_retry).
It goes through ``send_task`` by name, so the sending process need not import the task.
"""

from __future__ import annotations

from typing import Any

from celery import current_app
from celery.utils import uuid

from ..errors import ConfigurationError
from ..producer import KEY_HEADER


def redispatch(job: Any, countdown: float | None = None, task_id: str | None = None) -> str:
    """Publish ``job``'s task once more under a new task id, and return that id.

    ``job`` is a ``celery_idem.models.Job`` (or anything with its fields). The message
    carries the job's key, so it claims the same row instead of writing a new intent.
    ``task_id`` lets a caller record the id in the job before the message leaves.
    """
    if job.args is None and job.kwargs is None:
        raise ConfigurationError(
            f"job {job.namespace}:{job.key} has no stored arguments "
            "(CELERY_IDEM_STORE_ARGUMENTS is off), so it cannot be sent again"
        )
    task_id = task_id or uuid()
    options: dict[str, Any] = dict(job.options or {})
    if countdown:
        options["countdown"] = countdown
    current_app.send_task(
        job.task_name, args=list(job.args or ()), kwargs=dict(job.kwargs or {}),
        task_id=task_id, headers={KEY_HEADER: job.key}, **options,
    )
    return task_id
