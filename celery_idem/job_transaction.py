"""An atomic body's transaction (``atomic=True``): claim, body and commit in one
``transaction.atomic`` block, whose own failures on a lost connection are the database's,
not the body's (used by ``runner.Run.atomic``), and the database it runs on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import InterfaceError, OperationalError, transaction

from .backends import lost_connection
from .conf import settings
from .errors import ConfigurationError, PersistenceError


class Commit:
    """What ``job_transaction`` yields: the runner sets ``started`` once the body returned."""

    started = False


@contextmanager
def job_transaction(using: str) -> Iterator[Commit]:
    """``transaction.atomic(using=using)`` for an atomic body. A lost connection at its
    begin, in the body (``backends.lost``: the error the body let through left its
    connection unusable), at its commit (the commit statement, once ``started``, or the
    block's exit, where Django raises the failed reconnect in place of the error inside)
    raises PersistenceError: nothing was committed, or the outcome is unknown; the
    runner hands the attempt back rather than the job failing while its database is
    down. The body's own errors pass, database errors on a working connection too."""
    commit, inside = Commit(), []
    try:
        with transaction.atomic(using=using):
            try:
                yield commit
            except BaseException as exc:
                # Asked before the rollback, which closes a lost connection.
                inside.append((exc, lost_connection(exc)))
                raise
    except (OperationalError, InterfaceError) as exc:
        if inside and exc is inside[0][0] and inside[0][1] is None and not commit.started:
            raise  # the body's own error, its transaction rolled back as usual
        raise PersistenceError(f"the job database failed: {exc}") from exc


def atomic_alias(task: Any) -> str:
    """The job database, once it is certain that an atomic body writes there too.

    ``atomic=True`` is one transaction on the job database: writes the body makes on
    another alias would survive a rollback. So when the job tables are not on
    ``"default"`` (where models write unless routed), the task must say where its body
    writes (``atomic_database=``), and that must be the job database.
    """
    using: str = settings.DATABASE
    declared = getattr(task, "atomic_database", None)
    if declared is None and using == "default" or declared == using:
        return using
    raise ConfigurationError(
        f"{task.name} is atomic=True, but its job rows live on database {using!r} and "
        + (f"it declares atomic_database={declared!r}" if declared is not None else
           "it does not declare the database its body writes to")
        + ": its writes elsewhere would not roll back with the job. Write on "
        f"{using!r} and declare atomic_database={using!r}, or drop atomic=True")
