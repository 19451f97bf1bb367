"""Whether a body's database error lost its connection, or is the body's own.

A body that lets a database ``OperationalError`` or ``InterfaceError`` through did not
necessarily fail: the server may have closed its session (a pooler's ``KILL``, a
restart, a failover, ``pg_terminate_backend``, MariaDB's ``KILL``). Then the attempt is
handed back like a crash (``runner``). The same classes also carry errors that leave
the connection working, which are the body's own: a deadlock, a serialization failure,
a statement or lock timeout, a cancelled query, SQLite's ``database is locked``.

The test is the connection, not the message: a connection of this thread that the error
went through (Django marks it ``errors_occurred``) and that no longer works.

- PostgreSQL (psycopg 3 and psycopg2): the driver knows without a round trip: libpq
  marks a session the server closed as bad (``closed``), and a rolled-back or aborted
  transaction leaves it good.
- MySQL/MariaDB (mysqlclient and PyMySQL): a ``ping`` without reconnecting (a protocol
  command, not a statement: it works inside a transaction and changes nothing on the
  session); PyMySQL marks a socket that failed as closed first.
- SQLite: a file has no connection to lose, so its errors are always the body's.
- Any other database: Django's own ``is_usable()``.
"""

from __future__ import annotations

from typing import Any

from django.db import InterfaceError, OperationalError, connections


def lost_connection(exc: BaseException) -> str | None:
    """The alias whose connection ``exc`` (a body's error) lost, or None when ``exc`` is
    not a database connection error or every connection it went through still works."""
    if not isinstance(exc, OperationalError | InterfaceError):
        return None
    for wrapper in connections.all(initialized_only=True):
        if getattr(wrapper, "errors_occurred", False) and connection_lost(wrapper):
            return str(wrapper.alias)
    return None


def connection_lost(wrapper: Any) -> bool:
    """Whether Django's connection ``wrapper`` had a session the server no longer
    serves. False for one never opened or closed by the application on purpose."""
    raw = wrapper.connection
    if raw is None:
        # Django dropped it after a failed rollback (``Atomic.__exit__``): lost, if
        # anything went wrong on it; else simply not open.
        return bool(wrapper.errors_occurred)
    if wrapper.vendor == "postgresql":
        return bool(raw.closed)
    if wrapper.vendor == "mysql":
        return _mysql_lost(raw, wrapper.Database.Error)
    if wrapper.vendor == "sqlite":
        return False
    return not wrapper.is_usable()


def _mysql_lost(raw: Any, error: type[BaseException]) -> bool:
    if getattr(raw, "open", True) is False:  # PyMySQL closed the socket that failed
        return True
    try:
        # Never reconnect: that would hide the loss (and roll back). mysqlclient does
        # not by default and deprecates the argument; older PyMySQL did by default.
        raw.ping(False) if type(raw).__module__.startswith("pymysql") else raw.ping()
    except error:
        return True
    return False
