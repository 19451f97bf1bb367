"""The worker's Django connection policy ``keep`` (opt-in): keep connections across tasks.

Why: Celery's Django fixup closes every Django database connection before and after each
task. Celery 5.5 asked Django first (``close_if_unusable_or_obsolete()``); 5.6 and later
call ``close()`` unconditionally (and close Django 5.1+ pools under prefork), because a
time-limit signal can interrupt the driver mid-query and Django cannot tell such a
connection from a good one: the exception the signal raises (``SoftTimeLimitExceeded``)
is not a database error, so ``errors_occurred`` stays false and Django would hand the next
task a connection with a query still in flight. The price is a new PostgreSQL session
(a server process) per task and every statement planned afresh.

This policy replaces the fixup's per-task close (its other duties stay: closing the
parent's connections in a new pool child, validating models) with:

- before a task: ``close_if_unusable_or_obsolete()`` (``CONN_MAX_AGE``, and
  ``CONN_HEALTH_CHECKS`` if set, as in Django's request cycle);
- after a task: ``close()`` if the task did not end in SUCCESS (it failed, was retried,
  hit a time limit or was interrupted), if the connection is not idle at the driver level
  (a query still in flight or a transaction left open: a body that caught the time
  limit's exception and returned), or if it is inside ``atomic``; otherwise
  ``close_if_unusable_or_obsolete()``. A hard time limit kills the pool child; its
  replacement starts with no connection.

Turn it on with ``CELERY_IDEM_WORKER_CONNECTIONS = "keep"`` (applied when the worker
starts) or ``install(app)`` in the module that creates the Celery app.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, signals

from .connection import driver_idle

logger = logging.getLogger(__name__)

_UID = "celery_idem.worker_connections"


def install(app: Celery) -> None:
    """Use the ``keep`` policy in workers of ``app`` (call it where the app is created)."""
    def _on_worker_init(sender: Any = None, **_: Any) -> None:
        worker_app = getattr(sender, "app", None)
        if worker_app is None or worker_app is app:
            take_over(app)

    signals.worker_init.connect(_on_worker_init, weak=False, dispatch_uid=f"{_UID}.install")


def on_worker_init(sender: Any = None, **_: Any) -> None:
    """``worker_init`` receiver wired by the Django app: applies the setting."""
    from .conf import settings

    policy = settings.WORKER_CONNECTIONS  # validated (conf): ConfigurationError at start
    app = getattr(sender, "app", None)
    if policy == "keep" and app is not None:
        take_over(app)


def take_over(app: Celery) -> None:
    """Swap the fixup's per-task close for this policy (in the worker's main process,
    before the pool forks; again in each child, in case the fixup installed late)."""
    from django.conf import settings

    for alias, options in settings.DATABASES.items():
        # With a Django 5.1+ pool CONN_MAX_AGE must be 0: close() returns to the pool.
        if not options.get("CONN_MAX_AGE") and not options.get("OPTIONS", {}).get("pool"):
            logger.warning("celery-idem: CELERY_IDEM_WORKER_CONNECTIONS is 'keep' but "
                           "DATABASES[%r]['CONN_MAX_AGE'] is 0, so its connection is still "
                           "closed after every task; set it to seconds (or None)", alias)
    _disconnect_fixup(app)
    signals.task_prerun.connect(before_task, weak=False, dispatch_uid=f"{_UID}.prerun")
    signals.task_postrun.connect(after_task, weak=False, dispatch_uid=f"{_UID}.postrun")
    signals.worker_process_init.connect(
        lambda **_: _disconnect_fixup(app), weak=False, dispatch_uid=f"{_UID}.child")


def _disconnect_fixup(app: Celery) -> None:
    for fixup in getattr(app, "_fixups", None) or ():
        worker_fixup = getattr(fixup, "_worker_fixup", None)
        if worker_fixup is not None:
            signals.task_prerun.disconnect(worker_fixup.on_task_prerun)
            signals.task_postrun.disconnect(worker_fixup.on_task_postrun)


def before_task(sender: Any = None, **_: Any) -> None:
    if _eager(sender):
        return
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        _guarded(conn.close_if_unusable_or_obsolete if driver_idle(conn) else conn.close)


def after_task(sender: Any = None, state: str | None = None, **_: Any) -> None:
    if _eager(sender):
        return
    from django.core.cache import close_caches
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        settle(conn, state)
    close_caches()  # as the fixup does after each task


def settle(conn: Any, state: str | None) -> None:
    """After a task: close ``conn`` unless the task succeeded and left it idle; a kept
    connection still follows ``CONN_MAX_AGE`` and Django's error checks."""
    if state != "SUCCESS" or conn.in_atomic_block or not driver_idle(conn):
        _guarded(conn.close)
    else:
        _guarded(conn.close_if_unusable_or_obsolete)


def _eager(sender: Any) -> bool:
    return bool(getattr(getattr(sender, "request", None), "is_eager", False))


def _guarded(close: Any) -> None:
    # A connection the interrupted query broke may raise on close; it is gone either way.
    from django.db import DatabaseError, InterfaceError

    try:
        close()
    except (InterfaceError, DatabaseError):
        pass
