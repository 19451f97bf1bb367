"""The process's own PostgreSQL connections for bookkeeping: a worker's default-mode
claims and commits, and the producer's intents written outside a transaction.

Why: Celery's Django fixup closes every Django connection before and after each task
(``close()``, unconditionally since Celery 5.6), so each task opens a new connection. The
claim and the commit of a task that is not ``atomic`` do not share the body's
transaction, so they can use a connection the fixup does not know about: it stays open
across tasks, and its claims and commits do not wait for the WAL flush
(``CELERY_IDEM_SYNCHRONOUS_COMMIT``, set per transaction: ``backends.pipeline``). Its
statements are prepared only when the settings ask for it (``backends.prepared``).

It leaves nothing on its session (no prepared statement unless asked for, no ``SET``, no
startup option), because it goes where DATABASES points, which may be a transaction
pooler that hands the session to another client after each transaction.

The producer writes an intent outside a transaction here too (no Django cursor of the
caller's), and hands the connection back at once; that commit does wait for the flush:
its message is about to leave, and an intent a crash lost would have that message
refused rather than run.

For claims and commits the unflushed commit changes no guarantee: outside
``atomic=True`` a crash between the effect and the commit may already repeat the effect
once, and a PostgreSQL crash that loses the last fraction of a second of bookkeeping is
such a crash (recovery re-runs the job). The
writes are visible to every other session at once, as usual. ``atomic=True`` tasks and
anything inside your own transactions use Django's connection and its durability.

Every pool: a connection belongs to one thread of execution at a time (a pool process,
a ``-P threads`` thread, a ``-P gevent`` greenlet; gevent's monkeypatching makes
``threading.local`` greenlet-local). The first use in a thread takes an idle connection
from the process's pool of them, or opens one; ``task_postrun`` hands it back, because
the gevent pool runs every task in a new greenlet and would otherwise open one
connection per task. A psycopg connection must never be used by two threads at once;
the pool gives each one to a single holder, so Django's thread check is told sharing is
allowed (``inc_thread_sharing``) only to let the next holder in another thread use it.

Hygiene is Django's own: a connection is closed after an error or once older than
``CELERY_IDEM_CONNECTION_MAX_AGE``, and a forked child never reuses its parent's.
"""

from __future__ import annotations

import copy
import os
import threading
import weakref
from typing import Any

from django.db import connections
from django.db.utils import load_backend

from .conf import settings

#: The connections the current thread/greenlet holds, by alias.
_held = threading.local()
#: This process's idle connections, by alias, and every live connection it opened (weak:
#: one left held by a greenlet that ended without task_postrun is closed when collected).
_idle: dict[str, list[Any]] = {}
_opened: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_pid = os.getpid()
#: libpq's PQTRANS_IDLE (psycopg.pq.TransactionStatus.IDLE): no query, no transaction.
PQTRANS_IDLE = 0


def bookkeeping_connection(alias: str) -> Any:
    """The dedicated connection wrapper the current thread holds for ``alias``: taken
    from the idle ones or opened on first use, handed back by ``release_bookkeeping``."""
    _forget_parent()
    held = _held_by_me()
    wrapper = held.get(alias)
    if wrapper is None:
        with _lock:
            idle = _idle.get(alias)
            wrapper = idle.pop() if idle else None
        if wrapper is None:
            wrapper = _new_wrapper(alias)
            with _lock:
                _opened.add(wrapper)
        held[alias] = wrapper
    if not driver_idle(wrapper):
        # A statement was interrupted mid-flight (a soft time limit in the claim or the
        # commit): the session still runs it, and Django does not know it is unusable.
        wrapper.close()
    wrapper.close_if_unusable_or_obsolete()
    return wrapper


def driver_idle(conn: Any) -> bool:
    """Whether the driver says no query is in flight and no transaction is open (no round
    trip: libpq's own status). Non-PostgreSQL connections are left to Django's checks."""
    raw = conn.connection
    if raw is None or conn.vendor != "postgresql":
        return True
    pgconn = getattr(raw, "pgconn", None)
    if pgconn is not None:  # psycopg 3: libpq's int, without a ConnectionInfo and an enum
        return bool(pgconn.transaction_status == PQTRANS_IDLE)
    # psycopg2: TRANSACTION_STATUS_IDLE is 0
    return bool(raw.get_transaction_status() == 0)  # pragma: no cover


def release_bookkeeping() -> None:
    """Hand the current thread's connections back to the process's idle ones."""
    if os.getpid() != _pid:
        return
    held = _held_by_me()
    with _lock:
        for alias, wrapper in held.items():
            _idle.setdefault(alias, []).append(wrapper)
    held.clear()


def close_bookkeeping_connections() -> None:
    """Close every dedicated connection of this process (tests, shutdown, before dropping
    a database). Only while no task runs: another thread may hold one."""
    if os.getpid() == _pid:
        with _lock:
            opened = list(_opened)
        for wrapper in opened:
            wrapper.close()
    with _lock:
        _opened.clear()
        _idle.clear()
    _held_by_me().clear()


def open_count() -> int:
    """How many dedicated connections this process has opened (tests)."""
    _forget_parent()
    return len(_opened)


def _held_by_me() -> dict[str, Any]:
    try:
        return _held.wrappers
    except AttributeError:
        _held.wrappers = {}
        return _held.wrappers


def _forget_parent() -> None:
    # A forked pool child inherits its parent's objects; the sockets are the parent's.
    # psycopg does not close a connection garbage-collected in another process.
    # A new lock too: another thread of the parent may have held the old one at the fork.
    global _pid, _lock
    if os.getpid() != _pid:
        _lock = threading.Lock()
        _pid = os.getpid()
        _opened.clear()
        _idle.clear()
        _held_by_me().clear()


def on_task_postrun(**_: Any) -> None:
    """After each task: hand the thread's connections back (connected in apps.ready)."""
    release_bookkeeping()


def on_shutdown(**_: Any) -> None:
    """At worker and pool-process shutdown: close the idle connections."""
    # Close cleanly rather than leave the server to notice a dropped socket. Only the idle
    # connections and this thread's: Celery may send worker_shutdown before the pool has
    # stopped (a pool that is not signal-safe, such as gevent, stopped from a signal), and a
    # connection a running task holds is not this thread's to close.
    release_bookkeeping()
    if os.getpid() != _pid:
        return
    with _lock:
        idle = [wrapper for wrappers in _idle.values() for wrapper in wrappers]
        _idle.clear()
    for wrapper in idle:
        wrapper.close()


def _new_wrapper(alias: str) -> Any:
    # Copy the live settings (a test run points them at its test database).
    settings_dict = copy.deepcopy(connections[alias].settings_dict)
    options = settings_dict.setdefault("OPTIONS", {})
    # Imported here: only a PostgreSQL project has a driver to import (SQLite ones have no
    # bookkeeping connection and need no psycopg).
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    from .backends.prepared import threshold

    if is_psycopg3:
        # Parameters bound server-side (per message: nothing stays on the session), and
        # statements prepared only where the settings ask for it, then from their first
        # use: this connection outlives tasks (backends.prepared). Nothing else of the
        # session is changed: the unflushed commits are per transaction (backends.pipeline).
        options["prepare_threshold"] = threshold(options, 0)
        options["server_side_binding"] = True
    settings_dict["CONN_MAX_AGE"] = settings.CONNECTION_MAX_AGE
    # No health check: with close_if_unusable_or_obsolete() on every use it would ping
    # the server before each statement. A connection that raised is closed all the same
    # (Django marks errors_occurred), and the next use reconnects.
    settings_dict["CONN_HEALTH_CHECKS"] = False
    settings_dict["AUTOCOMMIT"] = True
    wrapper = load_backend(settings_dict["ENGINE"]).DatabaseWrapper(settings_dict, alias)
    # One holder at a time (see the module docstring); the holder may change threads.
    wrapper.inc_thread_sharing()
    return wrapper
