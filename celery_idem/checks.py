"""System checks (``manage.py check``): what would refuse a task, or lose the guarantee,
found before the worker runs. Every id, its meaning and its fix are in
``check_ids`` (docs/reference/checks.md is generated from it); the settings' own checks
are in ``checks_settings``.

Imported from ``CeleryIdemConfig.ready()``, which registers them. The Celery app they
read is ``celery.current_app``: the project's own once the project imports it, as
Celery's Django layout does in ``proj/__init__.py``.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

import django
from celery import Celery, current_app
from celery.local import Proxy
from django.conf import settings as django_settings
from django.core import checks
from django.db import connections
from django.utils.module_loading import import_string

from . import durability
from .check_ids import CHECKS
from .conf import settings
from .declaration import OPTIMISTIC
from .errors import ConfigurationError
from .recovery import liveness

TAG = "celery_idem"
#: A busy timeout, in seconds, under which SQLite's "database is locked" is likely.
SQLITE_MIN_TIMEOUT = 20
_WAL = re.compile(r"journal_mode\s*=\s*'?wal", re.IGNORECASE)
_importing = False


@checks.register(TAG)
def check_tasks(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E001: every idempotent task's declaration; E003: atomic tasks off the default
    database; E050: Django tasks the worker would not know. Imports the project's task
    modules, as the worker does when it starts."""
    from .idempotent_task import IdempotentTask

    tasks, errors = _load_tasks(_celery_app())
    errors += [(t.name, t._declaration_error) for t in tasks
               if getattr(t, "_declaration_error", None) is not None]
    messages: list[checks.CheckMessage] = [
        CHECKS["E001"](
            str(exc) if name in str(exc) else f"idempotent task {name}: {exc}",
            hint="Fix the task's declaration (idempotency_key, on_in_progress, "
                 "on_stale_claim, max_attempts): until then the task is refused by name "
                 "(its publishes raise, its messages fail without running).")
        for name, exc in errors
    ]
    if "celery_idem.tasks_backend" in sys.modules:
        # Django tasks of CeleryIdemBackend were declared (Django 6.0+): the check's
        # module imports django.tasks, so only then.
        from .djangotasks import discovery

        messages.extend(discovery.check(_celery_app()))
    atomic = sorted(t.name for t in tasks if isinstance(t, IdempotentTask) and t.atomic)
    if atomic and _job_database() not in (None, "default"):
        messages.append(CHECKS["E003"](
            f"atomic=True tasks ({', '.join(atomic)}) keep their job rows on "
            f"CELERY_IDEM_DATABASE={_job_database()!r}, not 'default'",
            hint="atomic=True commits the job row and the body's writes in one transaction "
                 "only if the body writes to the job database; writes to another database "
                 "are kept when the body fails. Use the body's database for "
                 "CELERY_IDEM_DATABASE, or, if your DATABASE_ROUTERS send the body's models "
                 "to it, silence this with SILENCED_SYSTEM_CHECKS = ['celery_idem.E003']."))
    return messages


@checks.register(TAG)
def check_optimistic_tasks(app_configs: Any = None,
                           **kwargs: Any) -> list[checks.CheckMessage]:
    """W009: what the ``atomic="optimistic"`` tasks give up, or that they gain nothing."""
    from .idempotent_task import IdempotentTask

    tasks, _ = _load_tasks(_celery_app())
    optimistic = sorted(t.name for t in tasks
                        if isinstance(t, IdempotentTask) and t.atomic == OPTIMISTIC)
    if not optimistic:
        return []
    return [CHECKS["W009"](
        f"atomic='optimistic' tasks ({', '.join(optimistic)}) "
        + ("run their bodies before any claim: duplicates run too and roll back, a "
           "failing body runs twice, only database effects are once"
           if not _writes_intent() else
           "run as atomic=True: CELERY_IDEM_DURABILITY is \"database\", so every "
           "message has a row before its body runs"))]


def _writes_intent() -> bool:
    try:
        return durability.writes_intent()
    except ConfigurationError:
        return True  # an unknown value is E007's


@checks.register(TAG)
def check_celery_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W001/W002: acknowledgement settings; W006/E004: the filesystem broker; E005: an
    event-loop pool the database driver cannot wait in; E007/W008/E051: the durability;
    E040/W040/W041: worker liveness and the recovery schedule."""
    conf = _celery_app().conf
    messages: list[checks.CheckMessage] = []
    if not conf.task_acks_late:
        messages.append(CHECKS["W001"](
            "task_acks_late is off: a worker that dies mid-task has already acknowledged "
            "its message, so only the recovery pass (after the lease) runs the job again",
            hint="Set CELERY_TASK_ACKS_LATE = True."))
    if not conf.task_reject_on_worker_lost:
        messages.append(CHECKS["W002"](
            "task_reject_on_worker_lost is off: the message of a task whose pool child "
            "was killed is not requeued; the job waits for the recovery pass",
            hint="Set CELERY_TASK_REJECT_ON_WORKER_LOST = True (with acks_late)."))
    messages.extend(_check_filesystem_broker(conf))
    messages.extend(_check_pool(str(conf.worker_pool or "")))
    messages.extend(durability.check(conf))
    messages.extend(_check_django_tasks_durability())
    messages.extend(liveness.check(conf))
    return messages


def _check_django_tasks_durability() -> list[checks.CheckMessage]:
    """E051: a CeleryIdemBackend in TASKS under broker durability."""
    aliases = _django_tasks_aliases()
    try:
        if not aliases or durability.writes_intent():
            return []
    except ConfigurationError:
        return []  # a bad CELERY_IDEM_DURABILITY is E007
    return [CHECKS["E051"](
        f"TASKS names CeleryIdemBackend ({', '.join(aliases)}) and CELERY_IDEM_DURABILITY "
        "is 'broker': a Django task's result is its job, which a publish writes only with "
        "database durability, so every enqueue raises")]


def _django_tasks_aliases() -> list[str]:
    """The aliases of ``TASKS`` whose backend is a CeleryIdemBackend (Django 6.0+)."""
    tasks = getattr(django_settings, "TASKS", None) or {}
    if not tasks or django.VERSION < (6, 0):
        return []
    from .tasks_backend import CeleryIdemBackend

    found = []
    for alias, params in tasks.items():
        try:
            backend = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue  # Django's own error names it
        if isinstance(backend, type) and issubclass(backend, CeleryIdemBackend):
            found.append(alias)
    return found


def _check_pool(pool: str) -> list[checks.CheckMessage]:
    # Only a pool named in the settings is seen here; ``celery worker -P`` is not.
    pool = pool.rsplit(":", 1)[-1].rsplit(".", 1)[-1].lower()
    if pool not in ("gevent", "eventlet"):
        return []
    alias = _job_database()
    if alias is None:
        return []
    engine = django_settings.DATABASES.get(alias, {}).get("ENGINE", "")
    # mysqlclient (MySQLdb) waits in C like sqlite3; PyMySQL standing in for it does not.
    c_mysql = "mysql" in engine and connections[alias].Database.__name__ == "MySQLdb"
    if pool == "eventlet" or "sqlite3" in engine or c_mysql:
        return [CHECKS["E005"](
            f"worker_pool is {pool!r} with the job database on "
            f"{engine.rsplit('.', 1)[-1] or alias}{' (mysqlclient)' if c_mysql else ''}: a "
            "task waiting for a database lock blocks the event loop while the task holding "
            "the lock cannot finish",
            hint="Use gevent with PostgreSQL or with MySQL/MariaDB on PyMySQL, or prefork, "
                 "solo or threads (docs/how-to/worker-pools.md).")]
    return []


@checks.register(TAG, checks.Tags.database)
def check_job_database(app_configs: Any = None, databases: Iterable[str] | None = None,
                       **kwargs: Any) -> list[checks.CheckMessage]:
    """W003-W005: SQLite's options for workers. (An alias not in DATABASES is E002,
    ``checks_settings``'.)"""
    alias = _job_database()
    if alias is None:
        return []
    config = django_settings.DATABASES[alias]
    if "sqlite3" not in config.get("ENGINE", ""):
        return []
    return _check_sqlite(alias, config.get("OPTIONS", {}))


@checks.register(TAG)
def check_prepared_statements(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W007: prepared statements asked for where the job database's OPTIONS forbid them."""
    alias = _job_database()
    if alias is None:
        return []
    return _check_prepared(alias, django_settings.DATABASES.get(alias, {}))


def setting(name: str) -> Any:
    """Setting ``name``, or None when it is not valid (``checks_settings`` reports it):
    one bad setting is one error, not a crash of every check that reads it."""
    try:
        return getattr(settings, name)
    except ConfigurationError:
        return None


def _job_database() -> str | None:
    alias = setting("DATABASE")
    return None if alias is None else str(alias)


def _check_prepared(alias: str, config: dict[str, Any]) -> list[checks.CheckMessage]:
    options = config.get("OPTIONS", {})
    if not (setting("PREPARED_STATEMENTS") and "postgresql" in config.get("ENGINE", "")
            and "prepare_threshold" in options and options["prepare_threshold"] is None):
        return []
    return [CHECKS["W007"](
        "CELERY_IDEM_PREPARED_STATEMENTS is on, but DATABASES"
        f"[{alias!r}]['OPTIONS']['prepare_threshold'] is None, which prepares "
        "nothing on that database: the setting has no effect",
        hint="Behind a transaction pooler without prepared-statement support (PgBouncer "
             "before 1.21, or without max_prepared_statements) set "
             "CELERY_IDEM_PREPARED_STATEMENTS = False; otherwise remove prepare_threshold "
             "from OPTIONS (docs/how-to/pgbouncer.md).")]


def _check_sqlite(alias: str, options: dict[str, Any]) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    timeout = options.get("timeout")
    if timeout is None or float(timeout) < SQLITE_MIN_TIMEOUT:
        messages.append(CHECKS["W003"](
            f"SQLite database {alias!r} waits {timeout or 5} s for a lock: a long atomic "
            "task makes the other workers' bookkeeping fail with 'database is locked'",
            hint=f"Set DATABASES[{alias!r}]['OPTIONS']['timeout'] to {SQLITE_MIN_TIMEOUT} "
                 "or more (seconds)."))
    if not _WAL.search(options.get("init_command", "")):
        messages.append(CHECKS["W004"](
            f"SQLite database {alias!r} is not in WAL mode: every write blocks every "
            "reader, so workers and the web process wait on each other",
            hint=f"Set DATABASES[{alias!r}]['OPTIONS']['init_command'] to "
                 "'PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;'."))
    if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
        messages.append(CHECKS["W005"](
            f"SQLite database {alias!r} starts transactions DEFERRED: an atomic task "
            "that reads, then writes, fails with 'database is locked' at once instead "
            "of waiting for the busy timeout",
            hint=f"Set DATABASES[{alias!r}]['OPTIONS']['transaction_mode'] to "
                 "'IMMEDIATE'."))
    return messages


def _check_filesystem_broker(conf: Any) -> list[checks.CheckMessage]:
    url = conf.broker_url or ""
    if not (isinstance(url, str) and url.startswith("filesystem:")):
        return []
    if (conf.broker_transport or "") == "celery_idem.filesystem:Transport":
        return []  # it creates its folders and publishes atomically
    options = conf.broker_transport_options or {}
    messages: list[checks.CheckMessage] = [CHECKS["W006"](
        "the broker is kombu's filesystem transport, which loses a message now and then "
        "(a consumer can take a file before it is written)",
        hint="Set CELERY_BROKER_TRANSPORT = 'celery_idem.filesystem:Transport' "
             "(it writes each message atomically and creates its folders).")]
    folders = {name: options.get(name, default) for name, default in (
        ("data_folder_in", "data_in"), ("data_folder_out", "data_out"),
        ("processed_folder", "processed"), ("control_folder", "control"))}
    missing = [f"{name}={path!r}" for name, path in folders.items() if not os.path.isdir(path)]
    if missing:
        messages.append(CHECKS["E004"](
            f"the filesystem broker's folders do not exist: {', '.join(missing)}",
            hint="Create them, or use CELERY_BROKER_TRANSPORT = "
                 "'celery_idem.filesystem:Transport', which creates them."))
    return messages


# -- loading the project's tasks -----------------------------------------------------------


def _celery_app() -> Celery:
    return current_app._get_current_object()


def _load_tasks(app: Celery) -> tuple[list[Any], list[tuple[str, Exception]]]:
    """Every task the worker would register, and the declarations that fail, by task.

    ``@shared_task`` classes are created only when an app finalizes, and a finalize stops
    at the first failure, so each one is created here on a throwaway app instead; the
    project's own ``@app.task`` decorators still pending are evaluated one by one.
    """
    errors: list[tuple[str, Exception]] = []
    global _importing
    if _importing:
        # Celery's Django fixup runs the system checks again while the task modules are
        # imported (validate_models): the outer run reports the tasks.
        return [], []
    _importing = True
    try:
        app.loader.import_default_modules()  # autodiscover_tasks() runs here
    except ConfigurationError as exc:  # a class-based task fails at import
        errors.append(("(while importing the task modules)", exc))
    finally:
        _importing = False
    probe = Celery("celery_idem.checks", set_as_current=False)
    from celery import _state

    for callback in list(getattr(_state, "_on_app_finalizers", ())):
        _create(functools.partial(callback, probe), callback, errors)
    for pending in list(getattr(app, "_pending", ())):
        _create(pending.__maybe_evaluate__, pending, errors)
    tasks = {**probe._tasks, **app._tasks}
    # ``@app.task`` is both pending on its app and shared: one error per task.
    unique = list({name: (name, exc) for name, exc in errors}.values())
    return list(tasks.values()), unique


def _create(make: Callable[[], Any], source: Any,
            errors: list[tuple[str, Exception]]) -> None:
    try:
        make()
    except ConfigurationError as exc:
        errors.append((_task_name(source), exc))
    except Exception:  # noqa: BLE001
        # Another library's task that cannot be built on a bare app is not ours to judge;
        # the worker, on the configured app, reports it.
        pass


def _task_name(source: Any) -> str:
    """The name of the task a shared_task callback or a pending proxy would create."""
    parts: list[Any] = []
    if isinstance(source, Proxy):  # any attribute access would evaluate it
        for attr, empty in (("_Proxy__args", ()), ("_Proxy__kwargs", {})):
            try:
                value = object.__getattribute__(source, attr)
            except AttributeError:
                value = empty
            parts.extend([value] if isinstance(value, dict) else value)
    else:
        parts.extend(cell.cell_contents for cell in getattr(source, "__closure__", None) or ())
    for part in parts:
        if isinstance(part, dict) and isinstance(part.get("name"), str):
            return part["name"]
    for part in parts:
        if callable(part) and hasattr(part, "__qualname__"):
            return f"{part.__module__}.{part.__qualname__}"
    return "(unknown task)"
