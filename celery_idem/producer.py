"""The producer side: the intent of a call, written before its message leaves.

``IdempotentTask.apply_async`` (``delay``, signatures, chains, groups) calls ``send``:
compute the key and the fingerprint (raising bad input before anything is sent), write
the PENDING intent, put the key in the message headers. ``app.send_task("name")``
bypasses ``apply_async``: ``celery_idem.by_name`` covers it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext
from contextvars import ContextVar
from dataclasses import replace
from datetime import datetime
from typing import Any

from celery.utils import uuid
from django.db import connections, transaction
from django.utils import timezone

from . import envelope, replays, unsent
from .backends import Change, ClaimOutcome, Intent, get_backend
from .children import BASE_HEADER, child_key, publishing_task, running_parent
from .conf import settings
from .connection import release_bookkeeping
from .durability import writes_intent
from .errors import KeyMismatch
from .fingerprints import fingerprint
from .keys import KEY_HEADER, KeySpec, validate_key
from .persistence import persistence
from .states import State

logger = logging.getLogger(__name__)

#: Header of a message with a key and no intent: the producer wrote none (broker
#: durability) or could not (a send_task of a task not registered there). The worker's
#: claim inserts the row, trying the insert first.
UNWRITTEN_HEADER = "celery_idem_unwritten"
#: Set while ``send`` publishes: the message already has its intent and key.
SENDING: ContextVar[bool] = ContextVar("celery_idem_sending", default=False)
#: apply_async options that decide where a message goes, kept to re-dispatch it.
ROUTING_OPTIONS = ("queue", "routing_key", "exchange", "priority")
#: The batch open in this context (``celery_idem.batching``): it takes the intents and
#: messages of the publishes made in it, and writes and sends them together at its end.
open_batch: ContextVar[Any] = ContextVar("celery_idem_batch", default=None)
#: While ``send`` hands a call to Celery: (task name, task id, what writes its bare
#: intent). Celery runs an eager call through the task's ``apply`` instead of publishing,
#: and ``IdempotentTask.apply`` writes the intent there (``write_eager_intent``), before
#: the body: no read of ``task_always_eager`` (a Celery setting under a Django namespace
#: costs about 140,000 instructions to read) on every publish.
_eager_intent: ContextVar[tuple[str, str, Callable[[], None]] | None] = ContextVar(
    "celery_idem_eager_intent", default=None)


def build_intent(spec: KeySpec, namespace: str, task_name: str, args: Any = None,
           kwargs: Any = None, key: str | None = None,
           options: dict[str, Any] | None = None) -> Intent:
    """The intent for one call: key, fingerprint and what to store. Raises bad input."""
    args, kwargs = tuple(args or ()), dict(kwargs or {})
    bound = spec.bind(args, kwargs)
    fp = fingerprint(bound)
    key = validate_key(key) if key is not None else spec.key(bound, args, kwargs)
    store = settings.STORE_ARGUMENTS
    return Intent(namespace, key, task_name, fp, list(args) if store else None,
                  kwargs if store else None, options or {})


def inserted_id(outcome: ClaimOutcome) -> int | None:
    """The id of the row a publish inserted; None if its key existed."""
    return outcome.row.id if outcome.won and outcome.row is not None else None


def write_intent(intent: Intent, task_id: str) -> ClaimOutcome:
    """Insert the PENDING intent, or find the key; raise KeyMismatch on other arguments.
    Its outcome: won (inserted), or the key's row as it stands.

    Inside the caller's transaction the write rides it (the outbox) with a savepoint of
    its own: a database error on it (bad input the driver refuses) rolls back to the
    savepoint, and the caller's transaction stays usable. Outside one it is an
    autocommitted write that shares nothing with the caller, so on PostgreSQL it goes on
    the process's bookkeeping connection (``celery_idem.connection``), with a commit that
    waits for the WAL flush as the server's own setting says (claims and commits there do
    not; an intent must: ``PostgreSQLBackend._insert``).
    """
    (outcome,) = write_intents([(intent, task_id)])
    row = outcome.row
    if not outcome.won and row is not None and row.fingerprint != intent.fingerprint:
        raise mismatch(intent, row)
    return outcome


def write_intents(intents: list[tuple[Intent, str]]) -> list[ClaimOutcome]:
    """Insert each (intent, task id) as ``write_intent`` does, one statement for them
    all when there are several (``Backend.publish_many``); their outcomes, in order.
    The caller checks the fingerprints."""
    alias = settings.DATABASE
    # Looked up once (Django's connection handler costs ~10,000 instructions a lookup).
    atomic = connections[alias].in_atomic_block
    dedicated = not atomic and bool(settings.DEDICATED_CONNECTION)
    backend = get_backend(alias, dedicated)
    try:
        # In the caller's transaction a savepoint of its own: a database error on it (bad
        # input the driver refuses) rolls back to it, and the caller's transaction stays
        # usable. Outside one an autocommitted write needs none.
        with persistence(), (backend.savepoint() if atomic else nullcontext()):
            if len(intents) == 1:
                intent, task_id = intents[0]
                return [backend.publish(intent, task_id, timezone.now())]
            return backend.publish_many(intents, timezone.now())
    finally:
        if dedicated:
            # Back to the process's idle connections at once: a web process has no
            # task_postrun to hand it back, and its next request may run on another
            # thread (a worker's claim takes it again on its next statement).
            release_bookkeeping()


def mismatch(intent: Intent, row: Any) -> KeyMismatch:
    """The KeyMismatch of ``intent`` against the stored ``row``, naming both arguments
    when the row stored them."""
    stored = None
    if row.args is not None or row.kwargs is not None:
        stored = {"args": row.args or [], "kwargs": row.kwargs or {}}
    new = {"args": intent.args or [], "kwargs": intent.kwargs or {}}
    return KeyMismatch.build(intent.namespace, intent.key, row.fingerprint, intent.fingerprint,
                             stored, new if intent.args is not None else None)


def delivery_options(options: dict[str, Any]) -> dict[str, Any]:
    """The routing part of apply_async options, as JSON (a kombu Queue becomes its name)."""
    kept = {}
    for name in ROUTING_OPTIONS:
        value = options.get(name)
        if value is not None:
            kept[name] = getattr(value, "name", value)
    return kept


def derived_key(spec: KeySpec, name: str, args: Any, kwargs: Any, options: dict[str, Any],
                headers: dict[str, Any]) -> str | None:
    """The key of a ``PER_CALL`` message sent without one on a job's behalf (its base
    goes in ``headers``); None outside a job, or for a task that makes its own key."""
    sender = publishing_task() if spec.per_call else None
    if sender is None:
        return None
    key, headers[BASE_HEADER] = child_key(sender, name, args, kwargs, options)
    return key


def in_transaction() -> bool:
    """Whether the caller is inside ``transaction.atomic()`` on the job database."""
    return bool(transaction.get_connection(settings.DATABASE).in_atomic_block)


def mark_sent(job_id: int, now: datetime | None = None) -> None:
    """Record that the message of an intent written in a transaction has left.

    On PostgreSQL on the bookkeeping connection, its commit not waiting for the WAL
    flush: a mark a crash lost leaves the intent looking never sent, and recovery sends
    its message again, a duplicate the key answers (the producer that dies before the
    mark is the same window)."""
    change = Change(job_id, "sent", State.PENDING, attempt=0,
                    values={"sent_at": now or timezone.now()})
    dedicated = bool(settings.DEDICATED_CONNECTION)
    try:
        with persistence():
            get_backend(settings.DATABASE, dedicated).apply(change, timezone.now())
    finally:
        if dedicated:
            release_bookkeeping()  # a web process has no task_postrun to hand it back


def _send_committed(app: Any, body: Any, kwargs: dict[str, Any], job_id: int | None) -> None:
    """The outbox's second half, after the commit: publish the message, mark it sent.

    Never raises into the committing caller: the intent is committed, and a message that
    did not leave is sent by recovery after ``CELERY_IDEM_NEVER_SENT_TIMEOUT``. Without
    an intent (broker durability) nothing can send it: logged as lost.
    """
    try:
        with app.producer_or_acquire() as producer:
            producer.publish(body, **kwargs)
        if job_id is not None:
            mark_sent(job_id)
    except Exception as exc:
        then = "recovery sends it" if writes_intent() else "no intent: it is lost"
        logger.error("message of job %s not sent after the commit: %s; %s", job_id, exc,
                     then, extra={"action": "outbox_send_failed", "job_id": job_id})


def send(task: Any, args: Any, kwargs: Any, options: dict[str, Any],
         key: str | None, publish: Callable[[dict[str, Any]], Any]) -> Any:
    """``_send`` with ``SENDING`` set: the publish hook leaves its message alone."""
    token = SENDING.set(True)
    try:
        return _send(task, args, kwargs, options, key, publish)
    finally:
        SENDING.reset(token)


def _send(task: Any, args: Any, kwargs: Any, options: dict[str, Any],
          key: str | None, publish: Callable[[dict[str, Any]], Any]) -> Any:
    """Write the intent of ``task(*args, **kwargs)`` and publish its message.

    ``publish(options)`` sends the message (Celery's own ``apply_async``) with the final
    options: the task id, the headers and a producer that captures the finished message
    (``envelope.Capture``), so the intent is written with its envelope in one statement
    just before the message leaves. Inside ``transaction.atomic()`` on the job database
    (an atomic body included) the intent is written in that transaction and the message
    leaves when it commits (the outbox); a rollback leaves neither.
    """
    headers = dict(options.pop("headers", None) or {})
    producer = options.pop("producer", None)
    parent = running_parent()
    if key is None and KEY_HEADER in headers:
        # A re-send that already carries its key: a retry, a wait, a re-dispatch. A
        # retry's message is what a later re-send must send (the retry count goes on).
        # A key a caller put in the headers by hand is checked like any other.
        validate_key(headers[KEY_HEADER])
        return _resend(task, parent, producer, publish, {**options, "headers": headers})
    spec: KeySpec = task.key_spec()
    if key is None:
        key = derived_key(spec, task.name, args, kwargs, options, headers)
    job = build_intent(spec, task.namespace, task.name, args, kwargs, key,
                       delivery_options(options))
    if parent is not None:  # the parent -> child link, shown on both jobs' admin pages
        job = replace(job, parent_id=parent.request._idem_claim.job_id)
    task_id = options["task_id"] = options.get("task_id") or uuid()
    headers[KEY_HEADER] = job.key
    intent_first = writes_intent()
    if not intent_first:  # broker durability: the worker's claim inserts the row
        headers[UNWRITTEN_HEADER] = True
    final = {**options, "headers": headers}
    outbox = in_transaction()
    # Argument reprs the caller set (to hide a secret, say) are kept; Celery's own are not.
    given = tuple(name for name in ("argsrepr", "kwargsrepr") if options.get(name) is not None)
    written: list[int | None] = []

    def on_publish(real: Any, body: Any, kw: dict[str, Any]) -> Any:
        if not intent_first:
            # Nothing to write: the message leaves now, or after the caller's commit
            # (Celery's delay_on_commit; a batch is just publishing).
            written.append(None)
            if outbox:
                transaction.on_commit(lambda: _send_committed(task.app, body, kw, None),
                                      using=settings.DATABASE)
                return None
            return real.publish(body, **kw)
        message = envelope.capture(body, kw, job, task.app, given)
        captured = replace(job, message=message, not_before=envelope.eta(message),
                           expires_at=envelope.expires(message), sent=not outbox)
        batch = open_batch.get()
        if batch is not None and batch.takes():
            batch.add(captured, task_id, task, body, kw)
            written.append(None)
            return None
        outcome = write_intent(captured, task_id)
        written.append(inserted_id(outcome))
        if replays.answer(outcome, captured, task, body, kw, task_id):
            return None  # the key succeeded, and nobody would see the replay
        if outbox:
            transaction.on_commit(lambda: _send_committed(task.app, body, kw, written[0]),
                                  using=settings.DATABASE)
            return None
        try:
            return real.publish(body, **kw)
        except Exception as exc:
            if not unsent.after_publish_error(settings.DATABASE, written[0], exc, task.app,
                                              task.name):
                raise
            return None

    def write_bare() -> None:
        written.append(inserted_id(write_intent(job, task_id)) if intent_first else None)

    # An eager call is run, not published: its bare intent is written by ``apply``
    # (nothing is published: no envelope to keep), before the body runs.
    token = _eager_intent.set((task.name, task_id, write_bare))
    try:
        result = _publish_captured(task, producer, publish, final, on_publish)
    finally:
        _eager_intent.reset(token)
    if not written and intent_first:  # Celery published nothing (a custom route or
        write_bare()                    # class): the bare intent
    return result


def write_eager_intent(task_name: str, task_id: str | None) -> None:
    """Called by ``IdempotentTask.apply``: when ``send`` is handing this very call to
    Celery, which runs it eagerly instead of publishing it, write its bare intent now,
    before the body (KeyMismatch raises here, as at any publish)."""
    pending = _eager_intent.get()
    if pending is not None and pending[:2] == (task_name, task_id):
        _eager_intent.set(None)  # the body's own publishes are theirs
        pending[2]()


def _resend(task: Any, parent: Any, producer: Any, publish: Callable[[dict[str, Any]], Any],
            final: dict[str, Any]) -> Any:
    if parent is None or final.get("task_id") != parent.request.id:
        return publish({**final, "producer": producer})

    def on_publish(real: Any, body: Any, kw: dict[str, Any]) -> Any:
        parent.request._idem_sent_message = envelope.capture(body, kw)
        return real.publish(body, **kw)

    return _publish_captured(task, producer, publish, final, on_publish)


def _publish_captured(task: Any, producer: Any, publish: Callable[[dict[str, Any]], Any],
                      final: dict[str, Any], on_publish: envelope.Publish) -> Any:
    """Publish through Celery with a producer whose ``publish`` goes through
    ``on_publish`` first (``envelope.Capture``): it sees the finished message."""
    if producer is not None:
        # What producer_or_acquire would yield, without its read of Celery's settings
        # (Celery's configuration lookups cost ~20 µs each under a Django namespace).
        return publish({**final, "producer": envelope.Capture(producer, on_publish)})
    with task.app.producer_or_acquire() as real:
        return publish({**final, "producer": envelope.Capture(real, on_publish)})

