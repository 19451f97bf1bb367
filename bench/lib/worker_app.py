"""The Celery app benchmark workers run: ``celery -A bench.lib.worker_app worker ...``.

It is the project's app (``django_app.celery``) plus, from the environment:

- the benchmark tasks (``bench.lib.tasks``) in ``imports``, and the
  prototype of a one-statement atomic path (``bench.onestmt``: ``bench.atomic1``);
- celery-once's lock backend on Redis (``BENCH_ONCE_URL``, default DB 7);
- ``BENCH_CONN``, how the worker treats Django's database connections between tasks:

  - ``fixup`` (default): Celery's Django fixup as shipped. On Celery 5.6+ it calls
    ``close()`` on every connection at every ``task_prerun`` and ``task_postrun``, so
    each task opens a new PostgreSQL connection.
  - ``reuse``: ``CELERY_DB_REUSE_MAX`` = ``BENCH_DB_REUSE_MAX`` (default 1000): the
    fixup closes connections only every that many tasks, and never checks them.
  - ``hygienic``: the fixup's prerun/postrun receivers replaced by Django's own
    request-cycle policy: ``close_if_unusable_or_obsolete()`` before and after each task
    (honours ``CONN_MAX_AGE``, set here to ``BENCH_CONN_MAX_AGE``, default 300 s, and
    closes a connection that saw errors and is unusable or was left in a transaction), plus an
    unconditional close when the task did not end in SUCCESS (a time limit or any
    exception may have interrupted the driver mid-protocol: celery#9824). This is the
    prototype of the worker setting proposed in docs/decisions/2026-11-22-keep-worker-connections-opt-in.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from celery import signals

from django_app.celery import app

app.conf.imports = (*tuple(app.conf.imports or ()), "bench.lib.tasks")
app.conf.ONCE = {
    "backend": "celery_once.backends.Redis",
    "settings": {
        "url": os.environ.get("BENCH_ONCE_URL", "redis://127.0.0.1:6379/7"),
        "default_timeout": 3600,
    },
}

CONN = os.environ.get("BENCH_CONN", "fixup")
if CONN not in ("fixup", "reuse", "hygienic"):
    raise RuntimeError(f"BENCH_CONN must be fixup, reuse or hygienic, not {CONN!r}")

if CONN == "reuse":
    # DjangoWorkerFixup reads it with app.conf.get('CELERY_DB_REUSE_MAX') when the
    # worker starts (celery/fixups/django.py, DjangoWorkerFixup.__init__).
    app.conf.CELERY_DB_REUSE_MAX = int(os.environ.get("BENCH_DB_REUSE_MAX", "1000"))


def _close_unusable_or_obsolete(**_: object) -> None:
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        conn.close_if_unusable_or_obsolete()


def _hygienic_postrun(state: str | None = None, **_: object) -> None:
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if state != "SUCCESS" or conn.in_atomic_block:
            conn.close()  # interrupted or failed: do not trust the protocol state
        else:
            conn.close_if_unusable_or_obsolete()


def _install_hygienic(sender: object = None, **_: object) -> None:
    """Runs after the fixup's own worker_init receiver, which connected at app creation."""
    from django.conf import settings

    for fixup in getattr(app, "_fixups", ()):
        worker_fixup = getattr(fixup, "_worker_fixup", None)
        if worker_fixup is None:
            continue
        signals.task_prerun.disconnect(worker_fixup.on_task_prerun)
        signals.task_postrun.disconnect(worker_fixup.on_task_postrun)
    for alias in settings.DATABASES:
        settings.DATABASES[alias]["CONN_MAX_AGE"] = float(
            os.environ.get("BENCH_CONN_MAX_AGE", "300"))
    signals.task_prerun.connect(_close_unusable_or_obsolete, weak=False)
    signals.task_postrun.connect(_hygienic_postrun, weak=False)


if CONN == "hygienic":
    signals.worker_init.connect(_install_hygienic, weak=False)


# -- the benchmark's clock: one pipelined Redis call per task, the same for every variant ------

_marker: list[object] = []


def _mark(**_: object) -> None:
    """After every task: count it and stamp the first and last finish (Redis DB 7)."""
    import time

    if not _marker:
        import redis

        _marker.append(redis.Redis.from_url(os.environ["BENCH_MARK_URL"]))
    prefix = f"benchmark:{os.environ['IDEM_QUEUE']}"
    now = repr(time.time())
    pipe = _marker[0].pipeline(transaction=False)  # type: ignore[attr-defined]
    pipe.incr(f"{prefix}:n")
    pipe.setnx(f"{prefix}:first", now)
    pipe.set(f"{prefix}:last", now)
    pipe.execute()


if os.environ.get("BENCH_MARK_URL"):
    signals.task_postrun.connect(_mark, weak=False)


# -- prototypes of proposed library changes (BENCH_PATCH), to measure them end to end --------
# Not the library: the lead decides. Each is applied in this process only.

def _patch_prepared() -> Callable[[], None]:
    """The PostgreSQL backend's statements as server-side prepared statements on every
    connection (the library already does so on its dedicated bookkeeping connection;
    this extends it to Django's, which atomic tasks and producers use): PostgreSQL plans
    each statement once per connection instead of at every execution."""
    import psycopg
    from django.db import connections

    from celery_idem.backends import postgresql

    def _fetch(self, sql, params):  # type: ignore[no-untyped-def]
        # the library's own connection choice (its dedicated one already prepares)
        conn = self._connection() if hasattr(self, "_connection") else connections[self.alias]
        conn.ensure_connection()
        with conn.wrap_database_errors:
            cursor = psycopg.Cursor(conn.connection)
            try:
                cursor.execute(sql, params, prepare=True)
                return cursor.fetchall()
            finally:
                cursor.close()

    original = postgresql.PostgreSQLBackend._fetch
    postgresql.PostgreSQLBackend._fetch = _fetch

    def undo() -> None:
        postgresql.PostgreSQLBackend._fetch = original

    return undo


def _patch_readonly_replay() -> Callable[[], None]:
    """A replay of a finished key writes no ``duplicate`` history line, so its statement
    writes nothing and its commit needs no WAL flush (the log line and signal stay).
    Today the library does this itself: the patch changes nothing now, and is
    kept so the earlier runs' commands still run.
    The move table says whether a move records; the claim statement renders from it."""
    import dataclasses

    from celery_idem import states
    from celery_idem.backends import queries

    original = states.MOVES["duplicate"]
    states.MOVES["duplicate"] = dataclasses.replace(original, recorded=False)
    queries.claim_sql.cache_clear()

    def undo() -> None:
        states.MOVES["duplicate"] = original
        queries.claim_sql.cache_clear()

    return undo


def _patch_dedicated_fix() -> Callable[[], None]:
    """The library's dedicated bookkeeping connection (celery_idem/connection.py) as it
    means to be: statements really prepared (Django passes ``prepare_threshold=None`` to
    psycopg unless OPTIONS sets it, so nothing is prepared) and no ``SELECT 1`` health
    check before every statement (``CONN_HEALTH_CHECKS`` plus a
    ``close_if_unusable_or_obsolete()`` per use pings the server each time); a connection
    that raised is still closed, because Django marks ``errors_occurred``."""
    try:
        from celery_idem import connection as idem_connection
    except ImportError:
        return lambda: None
    original = idem_connection._new_wrapper

    def _new_wrapper(alias):  # type: ignore[no-untyped-def]
        wrapper = original(alias)
        wrapper.settings_dict["CONN_HEALTH_CHECKS"] = False
        wrapper.settings_dict.setdefault("OPTIONS", {})["prepare_threshold"] = 0
        return wrapper

    idem_connection.close_bookkeeping_connections()
    idem_connection._new_wrapper = _new_wrapper

    def undo() -> None:
        idem_connection.close_bookkeeping_connections()
        idem_connection._new_wrapper = original

    return undo


PATCHES = {"prepared": _patch_prepared, "rodup": _patch_readonly_replay,
           "dedfix": _patch_dedicated_fix}


def _apply_patches(**_: object) -> None:
    for name in filter(None, os.environ.get("BENCH_PATCH", "").split(",")):
        PATCHES[name]()


if os.environ.get("BENCH_PATCH"):
    for _name in filter(None, os.environ["BENCH_PATCH"].split(",")):
        if _name not in PATCHES:
            raise RuntimeError(f"unknown BENCH_PATCH {_name!r}; choose from {sorted(PATCHES)}")
    signals.worker_process_init.connect(_apply_patches, weak=False)

__all__ = ["app"]
