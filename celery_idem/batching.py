"""Publishing many keyed tasks at once: one intent statement and one flush per batch.

``with celery_idem.batch():`` collects the publishes made in it (``apply_async``,
``delay``, a ``group``'s members, a chain's first task): each call computes its key and
fingerprint and raises bad input at once, as alone, and Celery builds its message; the
intents are written and the messages sent when the block ends, the intents in one
statement (``Backend.publish_many``). ``publish_many(signatures)`` is the same for a list
of signatures or one canvas.

At the end of the block, on the transaction state the block began in:

- outside a transaction: the intents in one autocommitted statement (one WAL flush), then
  the messages, on one producer connection;
- inside ``transaction.atomic()``: the intents in that transaction, and the messages when
  it commits, all of them in one ``on_commit`` callback (the outbox, as for one publish).

Each key keeps the guarantees of a single publish: its own row and stored message
(recovery re-sends each lost one), a key repeated in the batch is one job (the repeat's
message still leaves, and its worker replays or waits, as a second single publish would;
a key that already succeeded sends nothing when nobody would see the replay:
``celery_idem.replays``),
and a key stored with other arguments raises ``KeyMismatch`` at the end of the block,
after the batch's other messages left (or were queued for the commit); the first
mismatch is raised, the others are logged.

A publish made inside an ``atomic()`` block opened within the batch is not collected: it
is written at once, as without a batch, so a rollback of that savepoint takes it back.
Django has no hook that runs before a commit (``on_commit`` runs after it), which is why
the batch is a block of its own and not every ``atomic()``: the end of the ``with`` is
the flush, before the transaction commits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from . import replays, unsent
from .backends import Change, get_backend
from .conf import settings
from .persistence import persistence
from .producer import in_transaction, inserted_id, mismatch, open_batch, write_intents
from .states import State

logger = logging.getLogger(__name__)


@dataclass
class _Publish:
    """One publish the batch holds: its intent (with the envelope) and its message."""

    intent: Any
    task_id: str
    task: Any
    body: Any
    kwargs: dict[str, Any]


@dataclass
class Batch:
    """The publishes collected by one ``batch()`` block."""

    depth: int
    publishes: list[_Publish] = field(default_factory=list)

    def takes(self) -> bool:
        """Whether a publish now belongs to this batch: not in a savepoint opened since."""
        return _depth() == self.depth

    def add(self, intent: Any, task_id: str, task: Any, body: Any,
            kwargs: dict[str, Any]) -> None:
        self.publishes.append(_Publish(intent, task_id, task, body, kwargs))

    def flush(self) -> None:
        """Write the intents in one statement, then send (or queue for the commit) the
        messages of the keys accepted; raise the first KeyMismatch."""
        publishes, self.publishes = self.publishes, []
        if not publishes:
            return
        outbox = in_transaction()
        outcomes = write_intents([(replace(p.intent, sent=not outbox), p.task_id)
                                  for p in publishes])
        accepted: list[tuple[_Publish, int | None]] = []
        refused: list[Exception] = []
        for p, outcome in zip(publishes, outcomes, strict=True):
            row = outcome.row
            if not outcome.won and row is not None and row.fingerprint != p.intent.fingerprint:
                refused.append(mismatch(p.intent, row))
            elif not replays.answer(outcome, p.intent, p.task, p.body, p.kwargs, p.task_id):
                accepted.append((p, inserted_id(outcome)))
        if outbox:
            transaction.on_commit(lambda: _send_committed(accepted), using=settings.DATABASE)
        else:
            # A message that did not leave is accepted or refused as a single publish's
            # (unsent.after_publish_error); the refused raise with the mismatches.
            for p, job_id, exc in _send(accepted):
                if not unsent.after_publish_error(settings.DATABASE, job_id, exc, p.task.app,
                                                  p.task.name):
                    refused.append(exc)
        for error in refused[1:]:
            logger.error("batch publish refused: %s", error,
                         extra={"action": "publish_refused"})
        if refused:
            raise refused[0]


def _depth() -> int:
    return len(connections[settings.DATABASE].atomic_blocks)


@contextmanager
def batch() -> Iterator[Batch]:
    """Collect the publishes made in the block; write their intents in one statement and
    send their messages when it ends (see the module docstring). A batch inside a batch
    joins it. An exception out of the block writes and sends nothing of it."""
    current = open_batch.get()
    if current is not None:
        yield current
        return
    opened = Batch(_depth())
    token = open_batch.set(opened)
    try:
        yield opened
    finally:
        open_batch.reset(token)
    opened.flush()


def publish_many(signatures: Any) -> Any:
    """Publish ``signatures`` (an iterable of signatures, or one signature or canvas:
    a group, a chain) as one batch; their AsyncResults (a list for an iterable)."""
    with batch():
        if isinstance(signatures, Iterable) and not hasattr(signatures, "apply_async"):
            return [sig.apply_async() for sig in signatures]
        return signatures.apply_async()


def _send(accepted: list[tuple[_Publish, int | None]],
          ) -> list[tuple[_Publish, int | None, Exception]]:
    """Publish each message, on one producer (connection) per app; those that did not
    leave, with their error. Once the broker cannot be reached, the rest of its app's
    messages are not tried (each try would wait for Celery's publish retries)."""
    by_app: dict[int, list[tuple[_Publish, int | None]]] = {}
    for p, job_id in accepted:
        by_app.setdefault(id(p.task.app), []).append((p, job_id))
    failed: list[tuple[_Publish, int | None, Exception]] = []
    for group in by_app.values():
        down: Exception | None = None
        try:
            with group[0][0].task.app.producer_or_acquire() as producer:
                for p, job_id in group:
                    if down is not None:
                        failed.append((p, job_id, down))
                        continue
                    try:
                        producer.publish(p.body, **p.kwargs)
                    except Exception as exc:
                        failed.append((p, job_id, exc))
                        down = exc if unsent.unreachable(exc, p.task.app) else None
        except Exception as exc:  # no producer at all: none of them left
            tried = {id(p) for p, _, _ in failed}
            failed += [(p, job_id, exc) for p, job_id in group if id(p) not in tried]
    return failed


def _send_committed(accepted: list[tuple[_Publish, int | None]]) -> None:
    """The outbox's second half for a batch, after the commit: the messages, then the
    ``sent`` moves of those that left in one statement. Never raises into the committing
    caller: recovery sends what did not leave after ``CELERY_IDEM_NEVER_SENT_TIMEOUT``."""
    try:
        failed = _send(accepted)
        now = timezone.now()
        unsent_ids = {job_id for _, job_id, _ in failed}
        changes = [Change(job_id, "sent", State.PENDING, attempt=0, values={"sent_at": now})
                   for _, job_id in accepted if job_id is not None and job_id not in unsent_ids]
        if changes:
            with persistence():
                get_backend(settings.DATABASE).apply_batch(changes, now)
        if failed:
            logger.error("%d message(s) of a batch not sent after the commit: %s; recovery "
                         "sends them", len(failed), failed[0][2],
                         extra={"action": "outbox_send_failed"})
    except Exception as exc:
        logger.error("messages of a batch not all sent after the commit: %s; recovery sends "
                     "them", exc, extra={"action": "outbox_send_failed"})
