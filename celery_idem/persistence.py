"""The job database's errors as celery-idem's, and the one place bookkeeping is tried
again on a fresh connection after a dropped one (or SQLite's ``database is locked``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from django.db import Error, InterfaceError, OperationalError

from .backends import Backend
from .errors import ConfigurationError, NotMigrated, PersistenceError
from .installation import not_migrated

logger = logging.getLogger(__name__)


class _Persistence:
    """``persistence()``'s context: a class, not a ``@contextmanager`` generator, which
    cost three times the instructions (it wraps every bookkeeping statement)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Error, not only DatabaseError: a closed connection is an InterfaceError
        # (PyMySQL's, psycopg2's), which is not one.
        if isinstance(exc, Error):
            raise not_migrated(exc) or pooled_prepared(exc) or PersistenceError(
                f"the job database failed: {exc}") from exc


#: SQLSTATEs of a prepared statement that exists already or is missing on the session:
#: a transaction pooler handed the client another server session.
_PREPARED_ON_ANOTHER_SESSION = frozenset({"42P05", "26000"})


def pooled_prepared(exc: BaseException) -> ConfigurationError | None:
    """The configuration error behind psycopg's ``prepared statement "_pg3_0" already
    exists`` (or ``does not exist``), naming the setting; None for any other error."""
    if getattr(exc.__cause__, "sqlstate", None) not in _PREPARED_ON_ANOTHER_SESSION:
        return None
    return ConfigurationError(
        f"the job database refused a prepared statement ({exc}): its connection goes "
        "through a transaction pooler, which runs each transaction on another server "
        "session. Set CELERY_IDEM_PREPARED_STATEMENTS = False (and leave "
        "prepare_threshold out of the database's OPTIONS), or let the pooler keep them "
        "(PgBouncer 1.21+ with max_prepared_statements)")


_PERSISTENCE = _Persistence()


def persistence() -> _Persistence:
    """Turn database errors into PersistenceError, keeping the driver's error as cause."""
    return _PERSISTENCE


T = TypeVar("T")


def retrying(backend: Backend, step: Callable[[], T], backoff: tuple[float, ...],
             retried: list[bool] | None = None) -> T:
    """Run ``step`` (bookkeeping on ``backend``); on a dropped connection or a locked
    SQLite database, close the connection and try again after each of ``backoff``.

    Only outside a transaction: inside the caller's (or an atomic body's) the work is
    lost with the connection, so the error goes up. ``retried`` gets True appended when
    a try failed (its write may have landed all the same: the caller checks).
    """
    for pause in (*backoff, None):
        try:
            with persistence():
                return step()
        except PersistenceError as exc:
            if (pause is None or isinstance(exc, NotMigrated) or not _transient(exc.__cause__)
                    or not _fresh(backend)):
                raise
            logger.warning("job database: %s; trying again on a fresh connection in %ss",
                           exc.__cause__, pause, extra={"action": "bookkeeping_retry"})
            if retried is not None:
                retried.append(True)
            time.sleep(pause)
    raise AssertionError("unreachable")


def _transient(cause: BaseException | None) -> bool:
    # OperationalError: the server went away, a timeout, SQLite's "database is locked";
    # InterfaceError: the connection is already closed.
    return isinstance(cause, OperationalError | InterfaceError)


def _fresh(backend: Backend) -> bool:
    """Close ``backend``'s connection so the next use opens a new one; False inside a
    transaction, whose work cannot be retried."""
    connection = backend.connection()
    if connection is None:
        return True
    if connection.in_atomic_block:
        return False
    try:
        connection.close()
    except Error:
        pass  # already broken; Django forgot it all the same
    return True
