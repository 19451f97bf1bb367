"""The worker's side of recovery: its request class, and the shutdown receiver.

Faster recovery than the lease (docs/how-to/recovery.md): the worker's MainProcess learns
that a pool child died under an attempt (SIGKILL, OOM kill, hard time limit, revoke with
terminate) through ``Request.on_failure``/``on_timeout``, which run there and only there.
No signal covers every case: with ``acks_late`` and ``reject_on_worker_lost``, Celery
requeues the message and sends no ``task_failure`` (celery/worker/request.py), so
IdempotentTask names ``IdempotentRequest`` as its request class. The claim of exactly
that attempt (same task id, same ``host/pid`` worker, same attempt number) is handed
back at once by the rule of ``recovery.handback`` (released, or UNCERTAIN for a task
that must not re-run blindly, or dead-lettered), with the reason in the history; the
requeued message, or recovery's re-dispatch, runs a released one again. A warm
shutdown hands back whatever claim its own children still hold once the pool stopped.

Django's worker fixup manages connections in pool children only, so these MainProcess
handlers check their connection before use and close it after.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request
from django.db import connections
from django.utils import timezone

from .. import claims
from ..backends import Change, get_backend
from ..claims import describe_error
from ..conf import settings
from ..errors import Expired
from ..models import Job
from ..producer import KEY_HEADER, build_intent
from ..states import State
from .handback import plan, registered_task

logger = logging.getLogger(__name__)

#: Exceptions with which the MainProcess reports that a child died under a request.
CHILD_LOST = (WorkerLostError, Terminated, TimeLimitExceeded, SystemExit, KeyboardInterrupt)

#: Pool processes that accepted an idempotent task in this worker, for the shutdown sweep.
_pool_pids: set[int] = set()


@contextmanager
def main_process_connection(alias: str) -> Iterator[None]:
    """Use the MainProcess's connection to ``alias``: drop it first if it is broken or
    too old, and close it after, so an idle worker holds no connection."""
    connection = connections[alias]
    connection.close_if_unusable_or_obsolete()
    try:
        yield
    finally:
        connection.close()


class IdempotentRequest(Request):
    """Celery's request, plus: hand back the claim of an attempt whose child was lost."""

    def on_accepted(self, pid: int, time_accepted: float) -> None:
        _pool_pids.add(pid)
        super().on_accepted(pid, time_accepted)

    def on_failure(self, exc_info: Any, send_failed_event: bool = True,
                   return_ok: bool = False) -> None:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if isinstance(exc, CHILD_LOST):
            # Before Celery requeues the message: its redelivery then finds the key free,
            # and the history lists the loss before the next claim.
            self._hand_back(_describe(exc))
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        if not soft:
            self._hand_back(f"hard time limit ({timeout}s) exceeded")

    def _announce_revoked(self, reason: Any, terminated: Any, signum: Any,
                          expired: Any) -> None:
        super()._announce_revoked(reason, terminated, signum, expired)
        if expired:
            try:
                expire_job(self.task, self)
            # The job stays PENDING; the recovery pass ends it EXPIRED by its expires_at.
            except Exception:
                logger.exception("could not mark the job of expired task %s[%s]",
                                 self.name, self.id, extra={"action": "expire_failed"})

    def _hand_back(self, why: str) -> None:
        # A hard time limit reaches both on_failure and on_timeout: act once.
        if getattr(self, "_idem_handled", False):
            return
        self._idem_handled = True
        try:
            hand_back_lost_attempt(self.task, self, why)
        # A failed release must not take the worker down: the lease still expires and
        # recovery hands the claim back then.
        except Exception:
            logger.exception("could not hand back the claim of lost task %s[%s]",
                             self.name, self.id, extra={"action": "release_failed"})


def _describe(exc: BaseException) -> str:
    if isinstance(exc, Terminated):
        return f"revoked: the worker terminated the task ({exc})"
    if isinstance(exc, TimeLimitExceeded):
        return f"hard time limit ({exc}) exceeded"
    return f"worker lost: {type(exc).__name__}: {exc}".rstrip(": ")


def _job_for(task: Any, request: Request) -> Job | None:
    """The job row of ``request``'s key, found by the key header (or the arguments)."""
    key = request.request_dict.get(KEY_HEADER)
    if key is None:
        key = build_intent(task.key_spec(), task.namespace, task.name, request.args,
                           request.kwargs).key
    jobs = Job.objects.using(settings.DATABASE)
    job: Job | None = jobs.filter(namespace=task.namespace, key=key).first()
    return job


def hand_back_lost_attempt(task: Any, request: Request, why: str) -> bool:
    """Hand back the claim that ``request``'s attempt holds, if it still holds it.

    Returns whether a claim was handed back. A job still PENDING (an atomic body's
    claim rolls back with its worker) gets an ``attempt_lost`` line in its history.
    """
    if getattr(task, "key_spec", None) is None:
        return False  # not an idempotent task
    alias = settings.DATABASE
    worker = claims.worker_id(request.hostname, request.worker_pid)
    with main_process_connection(alias):
        job = _job_for(task, request)
        if job is None or job.task_id != request.id:
            return False  # another message owns the row now
        backend, now = get_backend(alias), timezone.now()
        if job.state == State.RUNNING and job.worker == worker:
            return backend.apply(plan(backend, job, task, why, resend=False).change, now)
        if job.state == State.PENDING:
            backend.apply(Change(
                job.id, "attempt_lost", State.PENDING, attempt=job.attempt, worker=worker,
                task_id=request.id, reason=f"{why}; no claim was committed (an atomic body "
                                           "rolls back with its worker)",
                task_name=job.task_name), now)
    return False


def expire_job(task: Any, request: Request) -> bool:
    """Celery dropped ``request``'s message as expired: its PENDING job ends EXPIRED."""
    if getattr(task, "key_spec", None) is None:
        return False  # not an idempotent task
    alias = settings.DATABASE
    with main_process_connection(alias):
        job = _job_for(task, request)
        if job is None or job.state != State.PENDING or job.task_id != request.id:
            return False  # claimed or ended meanwhile, or another message is the job's
        error = Expired(f"message {request.id} expired at {request.expires} before any "
                        "worker claimed it")
        return get_backend(alias).apply(Change(
            job.id, "expired", State.PENDING, attempt=job.attempt, task_id=request.id,
            reason=str(error), task_name=job.task_name, values={"error": describe_error(error),
                                       "finished_at": timezone.now(),
                                       "lease_expires_at": None}), timezone.now())


def on_worker_shutdown(sender: Any = None, **_: Any) -> None:
    """Hand back claims still held by this worker's pool children once the pool stopped.

    A warm shutdown lets running bodies finish, so this normally finds nothing; it
    catches claims whose child died without a report.
    """
    hostname = getattr(sender, "hostname", None)
    if not hostname or not _pool_pids:
        return
    alias = settings.DATABASE
    workers = [claims.worker_id(hostname, pid) for pid in sorted(_pool_pids)]
    try:
        with main_process_connection(alias):
            backend, now = get_backend(alias), timezone.now()
            held = Job.objects.using(alias).filter(state=State.RUNNING, worker__in=workers)
            for job in held:
                why = "the worker shut down while this attempt held the claim"
                backend.apply(plan(backend, job, registered_task(job.task_name), why,
                                   resend=False).change, now)
    # Shutdown must finish: the lease expires and recovery hands these claims back then.
    except Exception:
        logger.exception("could not hand back the claims of worker %s at shutdown", hostname,
                         extra={"action": "release_failed"})
