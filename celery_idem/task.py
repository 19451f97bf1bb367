"""``IdempotentTask``: the Celery task base class that runs a body once per idempotency key.

The producer side (``apply_async``) computes the key and fingerprint, writes the PENDING
intent and puts the key in the message headers, raising bad input before anything is
sent. The worker side (``__call__``) claims the key, runs the body holding the attempt
number as its fencing token, and commits the outcome conditional on that attempt; a
duplicate replays the stored outcome instead of running. See docs/protocol.md.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from celery.utils import uuid
from django.db import transaction
from django.utils import timezone

from . import claims, publishing
from .backends import ClaimOutcome, Intent
from .conf import settings
from .errors import (
    ConfigurationError,
    InProgress,
    KeyMismatch,
    PersistenceError,
    ResultNotJSON,
    StoredFailure,
)
from .fingerprints import check_json, fingerprint
from .keys import KeySpec, body_signature, validate_key
from .states import State

#: Message header that carries the idempotency key from producer to worker.
HEADER = "celery_idem_key"
#: Message header counting how often a duplicate has waited for a live claim.
WAITS_HEADER = "celery_idem_waits"

IN_PROGRESS_POLICIES = ("retry", "ignore", "raise")
STALE_CLAIM_POLICIES = ("redispatch", "uncertain")
#: The task options celery-idem reads; other ``idempotency_*`` names are typos.
OPTIONS = frozenset({
    "idempotency_key", "idempotency_namespace", "atomic", "on_in_progress",
    "on_stale_claim", "max_attempts", "lease",
})


class _DeclaredKey:
    """``idempotency_key``: the declaration on the class, the current key on an instance."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __get__(self, task: Any, owner: type | None = None) -> Any:
        if task is None:
            return self.source
        return getattr(task.request, "idempotency_key", None)


def _header(request: Any, name: str) -> Any:
    # A worker puts custom headers on the request itself; eager mode nests them.
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


class IdempotentTask(Task):
    """A task whose effect happens once per idempotency key, whatever is redelivered.

    Task options (pass them to ``@shared_task(base=IdempotentTask, ...)``):

    - ``idempotency_key``: a template over the task's parameters (``"ship/{order_id}"``),
      a callable taking the task's arguments, ``ALL_ARGUMENTS`` or ``PER_CALL``. Required.
    - ``idempotency_namespace``: keys are unique per namespace; default the task's name.
    - ``atomic``: run claim, body and commit in one transaction on the job database.
    - ``on_in_progress``: what a duplicate does when it meets a live claim: ``"retry"``
      (wait, then replay the outcome), ``"ignore"`` or ``"raise"`` (InProgress).
    - ``on_stale_claim``: what recovery does with a claim whose worker vanished:
      ``"redispatch"`` or ``"uncertain"`` (leave it to an operator).
    - ``max_attempts``: claims before the key is dead-lettered.
    - ``lease``: seconds a claim lives without a heartbeat (default: the hard time
      limit plus a grace, else ``CELERY_IDEM_DEFAULT_LEASE``).
    """

    idempotency_key: ClassVar[Any] = None
    idempotency_namespace: ClassVar[str | None] = None
    atomic: ClassVar[bool] = False
    on_in_progress: ClassVar[str] = "retry"
    on_stale_claim: ClassVar[str] = "redispatch"
    max_attempts: ClassVar[int | None] = None
    lease: ClassVar[float | None] = None

    _key_spec: ClassVar[KeySpec | None] = None

    #: The worker's MainProcess releases a claim at once when it loses the child that
    #: held it (see celery_idem.hooks.IdempotentRequest).
    Request = "celery_idem.hooks:IdempotentRequest"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("idempotency_key")
        if isinstance(declared, _DeclaredKey):
            return
        source = declared if "idempotency_key" in cls.__dict__ else cls.idempotency_key
        cls.idempotency_key = _DeclaredKey(source)  # type: ignore[assignment]
        if "run" not in cls.__dict__:
            return  # an abstract base: concrete tasks are checked when they define run
        cls._check_options()
        name = cls.__dict__.get("name") or f"{cls.__module__}.{cls.__qualname__}"
        cls._key_spec = KeySpec(name, source, body_signature(cls.__dict__["run"]))

    @classmethod
    def _check_options(cls) -> None:
        for attr in vars(cls):
            if attr.startswith("idempotency_") and attr not in OPTIONS:
                hint = difflib.get_close_matches(attr, OPTIONS, n=1)
                raise ConfigurationError(
                    f"unknown task option {attr!r}"
                    + (f": did you mean {hint[0]!r}?" if hint else "")
                )
        if cls.on_in_progress not in IN_PROGRESS_POLICIES:
            raise ConfigurationError(
                f"on_in_progress must be one of {IN_PROGRESS_POLICIES}, not {cls.on_in_progress!r}"
            )
        if cls.on_stale_claim not in STALE_CLAIM_POLICIES:
            raise ConfigurationError(
                f"on_stale_claim must be one of {STALE_CLAIM_POLICIES}, "
                f"not {cls.on_stale_claim!r}"
            )
        if cls.max_attempts is not None and cls.max_attempts < 1:
            raise ConfigurationError("max_attempts must be at least 1")

    # -- what the body sees ------------------------------------------------------------

    @property
    def namespace(self) -> str:
        """The namespace in which this task's keys are unique."""
        return self.idempotency_namespace or self.name

    @property
    def attempt(self) -> int | None:
        """The attempt number (fencing token) of the claim the body runs under."""
        claim = getattr(self.request, "_idem_claim", None)
        return claim.attempt if claim else None

    def heartbeat(self, seconds: float | None = None) -> datetime:
        """Extend this attempt's lease; raises ClaimLost if a newer attempt owns the key."""
        claim = getattr(self.request, "_idem_claim", None)
        if claim is None:
            raise ConfigurationError("heartbeat() is only valid inside a running task body")
        return claim.heartbeat(seconds)

    def external_key(self, scope: str = "") -> str:
        """A key for an external API's own idempotency header, stable across attempts."""
        digest = hashlib.sha256(f"{self.namespace}\0{self.idempotency_key}\0{scope}".encode())
        return f"idem-{digest.hexdigest()[:40]}"

    def effective_max_attempts(self) -> int:
        """max_attempts, else the setting, raised to cover the task's own max_retries."""
        if self.max_attempts is not None:
            return self.max_attempts
        return max(settings.MAX_ATTEMPTS, (self.max_retries or 0) + 1)

    def lease_seconds(self) -> float:
        """The lease: ``lease``, else the hard time limit plus a grace, else the default."""
        if self.lease is not None:
            return float(self.lease)
        hard = (self.request.timelimit or (None, None))[0] or self.time_limit
        if hard:
            return float(hard) + settings.LEASE_GRACE
        return float(settings.DEFAULT_LEASE)

    # -- producer side -----------------------------------------------------------------

    def intent(self, args: Any = None, kwargs: Any = None, key: str | None = None,
               options: dict[str, Any] | None = None) -> Intent:
        """The intent for one call: key, fingerprint and what to store. Raises bad input."""
        spec = self._key_spec
        if spec is None:
            raise ConfigurationError(f"{type(self).__name__} defines no task body")
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        bound = spec.bind(args, kwargs)
        fp = fingerprint(bound)
        key = validate_key(key) if key is not None else spec.key(bound, args, kwargs)
        store = settings.STORE_ARGUMENTS
        return Intent(self.namespace, key, self.name, fp, list(args) if store else None,
                      kwargs if store else None, options or {})

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: str | None = None, idempotency_key: str | None = None,
                    **options: Any) -> Any:
        """Send the task; ``idempotency_key=`` overrides the declared key for this call.

        Raises (before anything is sent) ArgumentsNotJSON, InvalidKey, MissingKey or
        KeyMismatch.
        """
        headers = dict(options.pop("headers", None) or {})
        if idempotency_key is None and HEADER in headers:
            # A re-send that already carries its key: a retry, a wait, a re-dispatch.
            return super().apply_async(args, kwargs, task_id, producer, link, link_error,
                                       shadow, headers=headers, **options)
        parent = publishing.current_claimed_task()
        if idempotency_key is None and self._key_spec is not None \
                and self._key_spec.per_call and parent is not None:
            idempotency_key = publishing.child_key(parent, self.name, args, kwargs)
        intent = self.intent(args, kwargs, idempotency_key, publishing.delivery_options(options))
        task_id = task_id or uuid()
        headers[HEADER] = intent.key
        publishing.write_intent(intent, task_id)

        def send() -> Any:
            return super(IdempotentTask, self).apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow,
                headers=headers, **options)

        if parent is not None and parent.atomic:
            # Inside an atomic body: send only if the body's transaction commits.
            transaction.on_commit(send, using=settings.DATABASE)
            return self.AsyncResult(task_id)
        return send()

    # -- worker side -------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            # A plain function call (e.g. a unit test of the body): no claim, no commit,
            # but the body still sees the key it would run under.
            spec = self._key_spec
            key = None if spec is None or spec.per_call else self.intent(args, kwargs).key
            self.push_request(idempotency_key=key)
            try:
                return super().__call__(*args, **kwargs)
            finally:
                self.pop_request()
        refused = publishing.refused_error(request)
        if refused is not None:
            raise refused
        key = _header(request, HEADER)
        intent = self.intent(args, kwargs, key)
        request.idempotency_key = intent.key
        worker = claims.worker_id(request.hostname, os.getpid())
        using = settings.DATABASE
        lease = self.lease_seconds()
        try:
            if self.atomic:
                return self._run_atomic(intent, worker, lease, using, args, kwargs)
            # A worker's bookkeeping for a non-atomic body need not share the body's
            # connection: celery_idem.connection explains the dedicated one.
            dedicated = settings.DEDICATED_CONNECTION and not request.is_eager
            outcome, claim = claims.acquire(intent, worker=worker, task_id=request.id,
                                            lease_seconds=lease, using=using,
                                            dedicated=dedicated)
        except PersistenceError as exc:
            return self._wait(exc, args, kwargs)
        if claim is None:
            return self._not_claimed(outcome, intent, args, kwargs)
        return self._run_claimed(claim, args, kwargs)

    def _run_claimed(self, claim: claims.Claim, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Any:
        if self._attempts_exhausted(claim):
            return self._dead_letter(claim)
        self.request._idem_claim = claim
        try:
            result = super().__call__(*args, **kwargs)
        except Retry as exc:
            claim.schedule_retry(_retry_eta(exc), f"retry: {exc.exc or exc.message or ''}"[:500])
            raise
        except (Ignore, Reject) as exc:
            claim.release(f"the body raised {type(exc).__name__}")
            raise
        except Exception as exc:
            claim.fail(exc)
            raise
        except BaseException:
            # Worker shutdown or interrupt: hand the key back rather than wait for the lease.
            claim.release("the worker stopped during the body")
            raise
        try:
            _storable(result)
        except ResultNotJSON as error:
            claim.fail(error)
            raise
        claim.succeed(result)
        return result

    def _run_atomic(self, intent: Intent, worker: str, lease: float, using: str,
                    args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = self.request
        try:
            with transaction.atomic(using=using):
                outcome, claim = claims.acquire(intent, worker=worker, task_id=request.id,
                                                lease_seconds=lease, using=using)
                if claim is not None:
                    if self._attempts_exhausted(claim):
                        return self._dead_letter(claim)
                    request._idem_claim = claim
                    result = super().__call__(*args, **kwargs)
                    _storable(result)
                    if not claim.succeed(result):
                        raise claims.ClaimLost(
                            f"attempt {claim.attempt} lost its claim; its writes roll back")
                    return result
        except claims.ClaimLost:
            raise
        except Retry as exc:
            # The body's writes and the claim rolled back; record the attempt and the retry.
            eta = _retry_eta(exc)
            self._record_rolled_back(intent, worker, lease, using,
                                     lambda c: c.schedule_retry(eta, "retry"))
            raise
        except (Ignore, Reject):
            raise  # rolled back to PENDING, which is where a released claim goes
        except PersistenceError as exc:
            if getattr(request, "_idem_claim", None) is None:
                return self._wait(exc, args, kwargs)
            raise
        except Exception as exc:
            error = exc
            self._record_rolled_back(intent, worker, lease, using, lambda c: c.fail(error))
            raise
        return self._not_claimed(outcome, intent, args, kwargs)

    def _record_rolled_back(self, intent: Intent, worker: str, lease: float, using: str,
                            commit: Callable[[claims.Claim], Any]) -> None:
        """After an atomic body rolled back, claim again and record how the attempt ended."""
        with transaction.atomic(using=using):
            _, claim = claims.acquire(intent, worker=worker, task_id=self.request.id,
                                      lease_seconds=lease, using=using)
            if claim is not None:
                commit(claim)

    def _attempts_exhausted(self, claim: claims.Claim) -> bool:
        limit = self.effective_max_attempts()
        # Only past the limit is the history read: a reset job starts a fresh budget.
        return claim.attempt > limit and claims.attempts_since_reset(
            claim.job_id, claim.attempt, claim.backend.alias) > limit

    def _dead_letter(self, claim: claims.Claim) -> Any:
        error = StoredFailure(
            f"DeadLettered: attempt {claim.attempt} exceeds max_attempts "
            f"{self.effective_max_attempts()}")
        claim.fail(error, "dead_lettered", "dead-lettered")
        raise error

    def _not_claimed(self, outcome: ClaimOutcome, intent: Intent, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Any:
        """A duplicate: replay the stored outcome, or apply the in-progress policy."""
        row = outcome.row
        if row is None:
            raise PersistenceError(f"job {intent.namespace}:{intent.key} vanished mid-claim")
        if row.fingerprint != intent.fingerprint:
            raise KeyMismatch.build(intent.namespace, intent.key, row.fingerprint,
                                    intent.fingerprint)
        if row.state is State.SUCCEEDED:
            return row.result
        if row.state is State.FAILED:
            raise StoredFailure.from_record(row.error)
        if row.state is State.UNCERTAIN:
            raise InProgress(f"job {intent.namespace}:{intent.key} is UNCERTAIN: "
                             "an operator must mark it succeeded or retry it")
        # RUNNING under a live lease, or PENDING that another claim is taking right now.
        if self.on_in_progress == "raise":
            raise InProgress(f"job {intent.namespace}:{intent.key} is running "
                             f"(attempt {row.attempt})")
        if self.on_in_progress == "ignore":
            raise Ignore()
        return self._wait(InProgress(f"attempt {row.attempt} holds the claim"), args, kwargs)

    def _wait(self, reason: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Re-queue this message with backoff, without counting against max_retries."""
        request = self.request
        if request.is_eager:
            raise reason
        waits = int(_header(request, WAITS_HEADER) or 0)
        countdown = min(settings.IN_PROGRESS_MAX_BACKOFF,
                        settings.IN_PROGRESS_BACKOFF * 2 ** min(waits, 16))
        headers = {**(request.headers or {}), HEADER: request.idempotency_key,
                   WAITS_HEADER: waits + 1}
        sig = self.signature_from_request(request, args, kwargs, countdown=countdown,
                                          headers=headers)
        sig.apply_async()
        raise Retry(exc=reason, when=countdown, sig=sig)


def _storable(result: Any) -> None:
    """Raise ResultNotJSON unless ``result`` can be stored and replayed."""
    try:
        check_json(result, "the task's result")
    except TypeError as exc:
        raise ResultNotJSON(str(exc)) from exc


def _retry_eta(exc: Retry) -> datetime | None:
    when = exc.when
    if isinstance(when, datetime):
        return when
    if isinstance(when, int | float):
        return timezone.now() + timedelta(seconds=when)
    return None


__all__ = ["HEADER", "IdempotentTask"]
