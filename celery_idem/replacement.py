"""``self.replace(sig)`` inside an idempotent body: the key's outcome becomes ``sig``'s.

Celery ends the replaced body with ``Ignore`` and sends ``sig`` under the body's own task
id, so the first caller's ``AsyncResult.get()`` already waits for the replacement. For
the key, celery-idem adds three things:

1. ``replacement``: ``sig`` gets a last step, ``celery_idem.replaced``
   (``celery_idem.tasks``), which commits the replacement's result on the claim (fenced
   by its attempt) and passes it on unchanged. Being the last step, it is the one that
   carries the body's task id.
2. ``hand_over``: before ``sig`` leaves (atomic: with the body's transaction), the claim
   makes the ``replaced`` move: RUNNING with no lease and no worker. No lease, so the
   recovery pass never takes it over; no worker, so no worker-lost hook or shutdown
   hands it back. The replaced body never runs again for that key.
3. ``settle``: a duplicate that meets such a claim waits (its ``on_in_progress``) until
   the last step committed, then replays the result; if the replacement failed (Celery
   marks the whole chain failed, the last step included) it fails the key with that
   error and raises it as StoredFailure.

A replacement whose message is lost leaves the claim RUNNING with no lease: the admin
shows it, and an operator releases it (the body then runs again, by their decision).
"""

from __future__ import annotations

from typing import Any

from celery.canvas import _chain
from celery.exceptions import Ignore
from django.db import transaction

from . import claims
from .backends import JobRow, get_backend
from .conf import settings
from .errors import ClaimLost, ConfigurationError, ResultNotJSON, StoredFailure
from .fingerprints import check_json
from .states import State

#: The registered name of the replacement's last step.
REPLACED_TASK = "celery_idem.replaced"


class Replaced(Ignore):
    """An atomic body replaced itself: its transaction commits (the body's writes and
    the hand-over), then the task ends as Celery's ``Ignore``."""


def _claim(task: Any) -> claims.Claim | None:
    request = task.request
    claim: claims.Claim | None = getattr(request, "_idem_claim", None)
    return None if request.is_eager else claim


def replacement(task: Any, sig: Any) -> Any:
    """``sig``, followed by the step that commits its result on the claim, if any."""
    claim = _claim(task)
    if claim is None:
        return sig  # eager (Celery runs sig in place) or not claimed
    if isinstance(sig, _chain) and not sig.tasks:
        # Celery refuses an empty chain (ImproperlyConfigured), and the body fails with
        # that; with the last step added it would not be empty, and would fail on the
        # worker for want of the result the step passes on.
        return sig
    if REPLACED_TASK not in task.app.tasks:
        # Sent anyway, the step would be refused as unregistered and the key would wait
        # for it for ever: fail now (the body's claim fails with this error).
        raise ConfigurationError(
            f"{task.name} replaced itself, but this worker has not imported "
            f"celery_idem.tasks ({REPLACED_TASK} is not registered), which commits a "
            "replacement's result: call app.autodiscover_tasks() with celery_idem in "
            "INSTALLED_APPS, or add 'celery_idem.tasks' to the app's imports")
    return sig | task.app.signature(REPLACED_TASK, args=(settings.DATABASE, claim.job_id,
                                                         claim.attempt))


def hand_over(task: Any, sig: Any) -> None:
    """Make the ``replaced`` move and send ``sig``; raises Ignore (or Replaced) as Celery's
    ``on_replace`` does. Returns only when nothing is claimed (Celery does the rest)."""
    claim = _claim(task)
    if claim is None:
        return
    if not claim.hand_over(f"replaced by {getattr(sig, 'name', None) or type(sig).__name__}"):
        raise ClaimLost(f"attempt {claim.attempt} lost its claim before its replacement left")
    claim.replaced = True
    if task.atomic:
        transaction.on_commit(sig.delay, using=settings.DATABASE)
        raise Replaced("Replaced by new task")
    sig.delay()
    raise Ignore("Replaced by new task")


def handed_over(row: JobRow) -> bool:
    """Whether ``row`` is a claim handed to its replacement (RUNNING with no lease)."""
    return row.state is State.RUNNING and row.lease_expires_at is None


def settle(task: Any, row: JobRow, worker: str) -> None:
    """For a duplicate meeting a handed-over claim: if the replacement failed, fail the
    key with its error and raise StoredFailure; else return (the caller waits)."""
    result = task.AsyncResult(row.task_id)
    if not result.failed():
        return
    error = result.result if isinstance(result.result, BaseException) else \
        RuntimeError(str(result.result))
    claim = claims.Claim(get_backend(settings.DATABASE), row.id, row.attempt, worker,
                         task.request.id or "", 0, task.name)
    claim.fail(error, reason=f"the replacement failed: {type(error).__name__}: {error}"[:500])
    raise StoredFailure.from_record(claims.describe_error(error))


def finish(result: Any, alias: str, job_id: int, attempt: int, worker: str,
           task_id: str) -> Any:
    """The replacement's last step: commit ``result`` as the key's outcome, pass it on."""
    backend = get_backend(alias, settings.DEDICATED_CONNECTION)
    claim = claims.Claim(backend, job_id, attempt, worker, task_id, 0)
    try:
        check_json(result, "the replacement's result")
    except TypeError as exc:
        error = ResultNotJSON(str(exc))
        claim.fail(error)
        raise error from exc
    claim.succeed(result)
    return result
