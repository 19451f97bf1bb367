"""The worker's own PostgreSQL connection for default-mode bookkeeping.

Why: Celery's Django fixup closes every Django connection before and after each task
(``close()``, unconditionally since Celery 5.6), so each task opens a new connection, and
every statement on it is planned from scratch. The claim and the commit of a task that
is not ``atomic`` do not share the body's transaction, so they can use a connection the
fixup does not know about: it stays open across tasks, its statements are prepared once
(psycopg's server-side binding), and it commits without waiting for the WAL flush.

That last point changes no guarantee: outside ``atomic=True`` a crash between the effect
and the commit may already repeat the effect once, and a PostgreSQL crash that loses the
last fraction of a second of bookkeeping is such a crash (recovery re-runs the job). The
writes are visible to every other session at once, as usual. ``atomic=True`` tasks and
anything inside your own transactions use Django's connection and its durability.

Hygiene is Django's own: the wrapper is closed after an error or once older than
``CELERY_IDEM_CONNECTION_MAX_AGE``, and a forked child never reuses its parent's.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from django.db import connections
from django.db.backends.postgresql.psycopg_any import is_psycopg3
from django.db.utils import load_backend

from .conf import settings

_wrappers: dict[str, tuple[int, Any]] = {}


def bookkeeping_connection(alias: str) -> Any:
    """This process's dedicated connection wrapper for ``alias`` (opened on first use)."""
    pid = os.getpid()
    entry = _wrappers.get(alias)
    if entry is None or entry[0] != pid:
        entry = _wrappers[alias] = (pid, _new_wrapper(alias))
    wrapper = entry[1]
    wrapper.close_if_unusable_or_obsolete()
    return wrapper


def close_bookkeeping_connections() -> None:
    """Close this process's dedicated connections (tests, before dropping a database)."""
    for pid, wrapper in list(_wrappers.values()):
        if pid == os.getpid():
            wrapper.close()
    _wrappers.clear()


def _new_wrapper(alias: str) -> Any:
    # Copy the live settings (a test run points them at its test database).
    settings_dict = copy.deepcopy(connections[alias].settings_dict)
    options = settings_dict.setdefault("OPTIONS", {})
    if is_psycopg3:
        # Django passes prepare_threshold=None to psycopg unless told otherwise, which
        # prepares nothing; 0 prepares each statement on its first use.
        options["server_side_binding"] = True
        options.setdefault("prepare_threshold", 0)
    if not settings.SYNCHRONOUS_COMMIT:
        options["options"] = f"{options.get('options', '')} -c synchronous_commit=off".strip()
    settings_dict["CONN_MAX_AGE"] = settings.CONNECTION_MAX_AGE
    # No health check: with close_if_unusable_or_obsolete() on every use it would ping
    # the server before each statement. A connection that raised is closed all the same
    # (Django marks errors_occurred), and the next use reconnects.
    settings_dict["CONN_HEALTH_CHECKS"] = False
    settings_dict["AUTOCOMMIT"] = True
    return load_backend(settings_dict["ENGINE"]).DatabaseWrapper(settings_dict, alias)
