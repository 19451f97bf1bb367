"""The worker side: claim the key, run the body under its attempt, commit the outcome.

``IdempotentTask.__call__`` hands every message to ``run``. A won claim runs the body
holding the attempt number as its fencing token and commits the outcome conditional on
that attempt; a duplicate replays the stored outcome instead of running; a duplicate
that meets a live claim applies the task's ``on_in_progress`` policy. In atomic mode the
claim, the body and the commit are one transaction on the job database.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded
from celery.result import ResultBase
from django.db import transaction
from django.utils import timezone

from . import claims, retries
from .backends import Claimant, ClaimOutcome, Intent, lost_connection
from .by_name import refused_error
from .children import header
from .conf import settings
from .declaration import OPTIMISTIC
from .errors import (
    ClaimLost,
    ConfigurationError,
    Expired,
    InProgress,
    IntentMissing,
    PersistenceError,
    ResultNotJSON,
    StoredFailure,
)
from .fingerprints import check_json
from .job_transaction import atomic_alias, job_transaction
from .producer import (
    KEY_HEADER,
    UNWRITTEN_HEADER,
    build_intent,
    delivery_options,
    mismatch,
)
from .replacement import Replaced, handed_over, settle
from .signals import duplicate_waiting
from .states import State

logger = logging.getLogger(__name__)

#: Message header counting how often a duplicate has waited for a live claim.
WAITS_HEADER = "celery_idem_waits"

Body = Callable[..., Any]


class Run:
    """One message of ``task`` on a worker: its intent, its claim, its outcome."""

    def __init__(self, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 body: Body) -> None:
        self.task, self.args, self.kwargs, self.body = task, args, kwargs, body
        self.request = task.request
        key = header(self.request, KEY_HEADER)
        #: No intent was written for this message (broker durability, or a send_task of
        #: a task the producer does not know): the claim inserts the row, trying that first,
        #: with the routing the message came by (a re-send of a released claim goes there).
        self.unwritten = bool(header(self.request, UNWRITTEN_HEADER))
        routing = delivery_options(self.request.delivery_info or {}) if self.unwritten else None
        self.intent: Intent = build_intent(task.key_spec(), task.namespace, task.name, args,
                                           kwargs, key, routing)
        self.request.idempotency_key = self.intent.key
        #: Sent by the library's producer, which wrote the intent first (see missing_intent);
        #: an eager ``apply`` runs here and now, with no transaction to wait for.
        self.published = key is not None and not self.request.is_eager and not self.unwritten
        self.worker = claims.worker_id(self.request.hostname, os.getpid())
        self.lease = task.lease_seconds()

    def acquire(self, dedicated: bool = False) -> tuple[ClaimOutcome, claims.Claim | None]:
        return claims.acquire(self.intent, worker=self.worker, task_id=self.request.id,
                              lease_seconds=self.lease, using=settings.DATABASE,
                              dedicated=dedicated, insert_missing=not self.published,
                              insert_first=self.unwritten)

    # -- default mode --------------------------------------------------------------------

    def plain(self) -> Any:
        # The bookkeeping of a non-atomic body need not share the body's connection:
        # celery_idem.connection explains the dedicated one.
        dedicated = settings.DEDICATED_CONNECTION and not self.request.is_eager
        try:
            outcome, claim = self.acquire(dedicated)
        except PersistenceError as exc:
            return self.wait(exc)
        if claim is None:
            return self.not_claimed(outcome)
        if self.exhausted(claim):
            return self.dead_letter(claim)
        self.request._idem_claim = claim
        try:
            result = self.body(*self.args, **self.kwargs)
        except Retry as exc:
            arguments = retries.new_arguments(self.task, self.intent, self.args, self.kwargs,
                                              exc)
            claim.schedule_retry(retries.eta(exc), f"retry: {exc.exc or exc.message or ''}"[:500],
                                 getattr(self.request, "_idem_sent_message", None), arguments)
            raise
        except (Ignore, Reject) as exc:
            if not claim.replaced:
                claim.release(f"the body raised {type(exc).__name__}")
            raise
        except Exception as exc:
            if lost_connection(exc) is not None:
                return self.hand_back(claim, exc)
            claim.fail(exc)
            raise
        except BaseException:
            # Worker shutdown or interrupt: hand the key back rather than wait for the lease.
            claim.release("the worker stopped during the body")
            raise
        try:
            stored = storable(result)
        except ResultNotJSON as error:
            claim.fail(error)
            raise
        claim.succeed(stored)
        return result

    # -- atomic mode ---------------------------------------------------------------------

    def atomic(self) -> Any:
        using = atomic_alias(self.task)
        try:
            with job_transaction(using) as commit:
                outcome, claim = self.acquire()
                if claim is not None:
                    if self.exhausted(claim):
                        return self.dead_letter(claim)
                    self.request._idem_claim = claim
                    try:
                        result = self.body(*self.args, **self.kwargs)
                    except Replaced as exc:
                        replaced = exc  # commit the body's writes and the hand-over
                    else:
                        stored = storable(result)
                        commit.started = True  # what fails from here is the database
                        if not claim.succeed(stored, ends_transaction=True):
                            raise ClaimLost(
                                f"attempt {claim.attempt} lost its claim; its writes roll back")
                        return result
            if claim is not None:
                raise replaced
        except (ClaimLost, Replaced):
            raise
        except Retry as exc:
            self.record_retry(exc)
            raise
        except (Ignore, Reject):
            raise  # rolled back to PENDING, which is where a released claim goes
        except PersistenceError as exc:
            # The transaction is gone with the connection (or its commit landed): the
            # message comes back; once the body ran (it held the claim), handed back first.
            return self.hand_back(None, exc) if self.request.get("_idem_claim") else self.wait(exc)
        except Exception as exc:
            error = exc
            self.record_rolled_back(lambda c: c.fail(error))
            raise
        return self.not_claimed(outcome)

    # -- optimistic atomic mode ----------------------------------------------------------

    def optimistic(self) -> Any:
        """``atomic="optimistic"``: a first delivery whose key has no row runs its body
        with no claim, and the body's transaction ends with one insert of the key's row
        already SUCCEEDED (``committed``). Whatever else happens rolls the body back and
        runs the message as ``atomic=True`` does (claim, body, commit), where it is
        replayed, waits or runs again: the key has a row (a duplicate that lost the
        insert, a retry, an intent), the body raised, its result is not JSON."""
        if not self.first_delivery_without_row():
            return self.atomic()
        using = atomic_alias(self.task)
        claimant = self.claimant()
        self.request._idem_optimistic = True
        try:
            with job_transaction(using) as commit:
                result = self.body(*self.args, **self.kwargs)
                stored = storable(result)
                commit.started = True  # what fails from here is the database
                if claims.commit_new(self.intent, claimant, stored, using=using):
                    return result
                raise _RowExists  # rolls the body's writes back
        except _RowExists:
            pass
        except Retry as exc:
            self.record_retry(exc)  # Celery sent the retry's message already
            raise
        except (Ignore, Reject, ConfigurationError):
            raise  # nothing was written: the transaction rolled back
        except PersistenceError as exc:
            return self.wait(exc)  # the commit may have landed: the next delivery claims
        except SoftTimeLimitExceeded as exc:
            # Its time is up: recorded as atomic=True records a failure, not run again.
            error = exc
            self.record_rolled_back(lambda c: c.fail(error))
            raise
        except Exception:
            # The body's error or a result that is not JSON: run again under a claim,
            # which records the failure, or replays a copy that won meanwhile.
            pass
        finally:
            self.request._idem_optimistic = False
        return self.atomic()

    def first_delivery_without_row(self) -> bool:
        """Whether this message most likely finds no row for its key: none was written
        for it (broker durability) and it is neither a retry nor a duplicate that waited."""
        return (self.unwritten and not self.request.retries
                and header(self.request, WAITS_HEADER) is None)

    def claimant(self) -> Claimant:
        """This attempt as the row's claimant: an optimistic commit holds no lease."""
        now = timezone.now()
        return Claimant(self.worker, self.request.id, now, now)

    def record_retry(self, exc: Retry) -> None:
        """After an atomic body called ``self.retry()`` and rolled back: claim again and
        record the attempt and the retry (its message left already)."""
        eta = retries.eta(exc)
        sent = getattr(self.request, "_idem_sent_message", None)
        arguments = retries.new_arguments(self.task, self.intent, self.args, self.kwargs, exc)
        self.record_rolled_back(lambda c: c.schedule_retry(eta, "retry", sent, arguments))

    def hand_back(self, claim: claims.Claim | None, exc: BaseException) -> Any:
        from .recovery.handback import hand_back_lost  # the connection was lost: see there
        return self.wait(hand_back_lost(claim, self.task, exc, self.record_rolled_back))

    def record_rolled_back(self, commit: Callable[[claims.Claim], Any]) -> None:
        """After an atomic body rolled back, claim again and record how the attempt ended."""
        with transaction.atomic(using=settings.DATABASE):
            _, claim = self.acquire()
            if claim is not None:
                commit(claim)

    # -- attempts, duplicates, waits -----------------------------------------------------

    def exhausted(self, claim: claims.Claim) -> bool:
        limit = self.task.effective_max_attempts()
        # Only past the limit is the history read: a reset job starts a fresh budget.
        return claim.attempt > limit and claim.attempts() > limit

    def dead_letter(self, claim: claims.Claim) -> Any:
        error = StoredFailure(
            f"DeadLettered: attempt {claim.attempt} exceeds max_attempts "
            f"{self.task.effective_max_attempts()}")
        claim.fail(error, "dead_lettered", "dead-lettered")
        raise error

    def not_claimed(self, outcome: ClaimOutcome) -> Any:
        """A duplicate: replay the stored outcome, or apply the in-progress policy."""
        row, intent = outcome.row, self.intent
        if row is None and self.published:
            return self.missing_intent()
        if row is None:
            raise PersistenceError(f"job {intent.namespace}:{intent.key} vanished mid-claim")
        if row.fingerprint != intent.fingerprint:
            if row.state is State.RUNNING and self.request.retries:
                # A retry with new arguments that came before its attempt recorded them.
                return self.wait(InProgress(f"attempt {row.attempt} holds the claim"))
            raise mismatch(intent, row)
        if row.state is State.SUCCEEDED:
            return row.result
        if row.state is State.FAILED:
            raise StoredFailure.from_record(row.error)
        if handed_over(row):
            settle(self.task, row, self.worker)  # raises if the replacement failed
        if row.state is State.EXPIRED:
            raise Expired.from_record(row.error)
        if row.state is State.UNCERTAIN:
            raise InProgress(f"job {intent.namespace}:{intent.key} is UNCERTAIN: "
                             "an operator must mark it succeeded or retry it")
        # RUNNING under a live lease, or PENDING that another claim is taking right now.
        policy = self.task.on_in_progress
        if policy == "raise":
            raise InProgress(f"job {intent.namespace}:{intent.key} is running "
                             f"(attempt {row.attempt})")
        if policy == "ignore":
            raise Ignore()
        duplicate_waiting.send(sender=None, task_name=self.task.name, job_id=row.id,
                               attempt=row.attempt)
        return self.wait(InProgress(f"attempt {row.attempt} holds the claim"))

    def missing_intent(self) -> Any:
        """A message with a key whose intent does not exist: it rolled back with its
        transaction (or is not committed yet, or was forgotten). Never run it: wait for
        the intent with backoff for MISSING_INTENT_TIMEOUT, then refuse (docs/how-to/recovery.md
        "Transactions")."""
        key = f"{self.intent.namespace}:{self.intent.key}"
        waits = int(header(self.request, WAITS_HEADER) or 0)
        if _waited(waits) < float(settings.MISSING_INTENT_TIMEOUT):
            return self.wait(IntentMissing(f"no intent for {key} yet"))
        logger.error("refused message %s of %s: its intent %s does not exist (rolled back "
                     "or forgotten)", self.request.id, self.task.name, key,
                     extra={"action": "intent_missing", "key": self.intent.key})
        raise IntentMissing(f"job {key} has no intent: its transaction rolled back, or it "
                            "was forgotten; the message is refused")

    def wait(self, reason: Exception) -> Any:
        """Re-queue this message with backoff, without counting against max_retries."""
        request = self.request
        if request.is_eager:
            raise reason
        waits = int(header(request, WAITS_HEADER) or 0)
        countdown = min(settings.IN_PROGRESS_MAX_BACKOFF,
                        settings.IN_PROGRESS_BACKOFF * 2 ** min(waits, 16))
        map_task = getattr(request, "_idem_map_task", None)
        if map_task is not None:
            # An item of map/starmap/chunks has no message of its own: the whole map
            # waits and runs again (its finished items replay), unlimited like a wait.
            map_retries = map_task.request.retries or 0
            raise map_task.retry(exc=reason, max_retries=None, countdown=min(
                settings.IN_PROGRESS_MAX_BACKOFF,
                settings.IN_PROGRESS_BACKOFF * 2 ** min(map_retries, 16)))
        headers = {**(request.headers or {}), KEY_HEADER: request.idempotency_key,
                   WAITS_HEADER: waits + 1}
        sig = self.task.signature_from_request(request, self.args, self.kwargs,
                                               countdown=countdown, headers=headers)
        sig.apply_async()
        raise Retry(exc=reason, when=countdown, sig=sig)


def run(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any], body: Body) -> Any:
    """Run one message of the idempotent ``task``; ``body`` is the task's own body."""
    request = task.request
    refused = refused_error(request)
    if refused is not None:
        raise refused
    if request.is_eager and task.key_spec().per_call and header(request, KEY_HEADER) is None:
        return body(*args, **kwargs)  # apply() without a key: a plain call (task.apply)
    message = Run(task, args, kwargs, body)
    if task.atomic == OPTIMISTIC:
        return message.optimistic()
    return message.atomic() if task.atomic else message.plain()


class _RowExists(Exception):
    """Raised inside an optimistic body's transaction whose key has a row: rolls it back."""


def storable(result: Any) -> Any:
    """``result`` as stored and replayed: a Celery result (a chain or group the body
    started) as the tuple Celery's result backend stores for it; ResultNotJSON unless
    that is JSON."""
    if isinstance(result, ResultBase):
        result = result.as_tuple()
    try:
        check_json(result, "the task's result")
    except TypeError as exc:
        raise ResultNotJSON(str(exc)) from exc
    return result


def _waited(waits: int) -> float:
    """Seconds ``waits`` re-queues of ``Run.wait`` have waited so far."""
    return sum(min(settings.IN_PROGRESS_MAX_BACKOFF, settings.IN_PROGRESS_BACKOFF * 2 ** i)
               for i in range(min(waits, 64)))
