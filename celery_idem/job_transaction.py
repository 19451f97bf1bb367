"""An atomic body's transaction (``atomic=True``): claim, body and commit in one
``transaction.atomic`` block, whose own failures on a lost connection are the database's,
not the body's (used by ``runner.Run.atomic``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import InterfaceError, OperationalError, transaction

from .errors import PersistenceError


class Commit:
    """What ``job_transaction`` yields: the runner sets ``started`` once the body returned."""

    started = False


@contextmanager
def job_transaction(using: str) -> Iterator[Commit]:
    """``transaction.atomic(using=using)`` for an atomic body. A lost connection at its
    begin, at its commit (the commit statement, once ``started``, or the block's exit,
    where Django raises the failed reconnect in place of the error inside) raises
    PersistenceError: the outcome is unknown, the message waits and comes back, rather
    than the job failing while its database is down. The body's own errors pass."""
    commit, inside = Commit(), []
    try:
        with transaction.atomic(using=using):
            try:
                yield commit
            except BaseException as exc:
                inside.append(exc)
                raise
    except (OperationalError, InterfaceError) as exc:
        if inside and exc is inside[0] and not commit.started:
            raise  # the body's own error, its transaction rolled back as usual
        raise PersistenceError(f"the job database failed: {exc}") from exc
