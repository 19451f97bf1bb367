"""``CeleryIdemBackend``: Django's Tasks framework (``django.tasks``, Django 6.0+) on the
project's Celery workers, each task's effect once per idempotency key.

::

    TASKS = {"default": {"BACKEND": "celery_idem.tasks_backend.CeleryIdemBackend"}}

    from django.tasks import task

    @task(idempotency_key="ship/{order_id}")   # Django 6.1; on 6.0 this module's task()
    def ship_order(order_id): ...

    result = ship_order.enqueue(42)           # twice, or from two processes: one run

A task is declared with the backend's task class, ``CeleryIdemTask``, which takes
IdempotentTask's options (``idempotency_key``, ``atomic``, ``on_in_progress``, ...).
``enqueue()`` is a publish of celery-idem: the key and fingerprint checked, the intent
written, inside ``transaction.atomic()`` the message leaving on commit; a duplicate meets
the same job, whose id is the result id. ``get_result(id)`` reads the job row.
docs/how-to/django-tasks.md is the guide; ``celery_idem.djangotasks`` holds the parts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from inspect import iscoroutinefunction
from typing import Any
from urllib.parse import urlparse

from celery import current_app
from django.db import transaction

from . import durability
from .conf import settings
from .declaration import OPTIMISTIC
from .durability import AMQP_SCHEMES
from .errors import ConfigurationError, PersistenceError
from .keys import validate_key
from .producer import build_intent, derived_key, in_transaction

try:
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskResult,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_PRIORITY, TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued
except ImportError as exc:  # Django before 6.0
    import django

    raise ConfigurationError(
        "celery_idem.tasks_backend runs Django's Tasks framework (django.tasks), which "
        f"Django 6.0 added; this is Django {django.get_version()}") from exc

from .djangotasks import adapter, discovery, results

#: Broker URL schemes whose priorities count down (0 is the highest): kombu's Redis.
REDIS_SCHEMES = frozenset({"redis", "rediss", "sentinel", "redis+socket"})
#: Celery's priorities the Django ones map onto, lowest to highest.
CELERY_PRIORITIES = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class CeleryIdemTask(Task):
    """A Django task run through celery-idem: ``CeleryIdemBackend.task_class``.

    Its options are IdempotentTask's, with the same meanings, defaults (None here) and
    checks: a task that declares no ``idempotency_key`` is refused by name (its enqueue
    raises ``ConfigurationError``, ``manage.py check`` reports ``celery_idem.E001``).
    ``.using(idempotency_key=...)`` gives one call its own key.
    """

    idempotency_key: Any = None
    idempotency_namespace: str | None = None
    atomic: bool | str = False
    atomic_database: str | None = None
    on_in_progress: str | None = None
    on_stale_claim: str | None = None
    max_attempts: int | None = None
    lease: float | None = None
    #: The key of this call, set by ``.using(idempotency_key=...)``; None: the declared one.
    call_key: str | None = None

    def __post_init__(self) -> None:
        # Django's check first (the backend's validate_task); then the adapter, so a
        # worker that imports this module knows the task.
        Task.__post_init__(self)
        adapter.register(self)

    def using(self, *, priority: int | None = None, queue_name: str | None = None,
              run_after: datetime | None = None, backend: str | None = None,
              idempotency_key: str | None = None) -> CeleryIdemTask:
        """Django's ``using``, and ``idempotency_key=``: the key of the calls made with
        the task it returns (checked now: ``InvalidKey``)."""
        task: CeleryIdemTask = Task.using(self, priority=priority, queue_name=queue_name,
                                          run_after=run_after, backend=backend)
        if idempotency_key is not None:
            task = replace(task, call_key=validate_key(idempotency_key))
        return task


def task(function: Callable[..., Any] | None = None, *, priority: int = DEFAULT_TASK_PRIORITY,
         queue_name: str = DEFAULT_TASK_QUEUE_NAME, backend: str = DEFAULT_TASK_BACKEND_ALIAS,
         takes_context: bool = False, **options: Any) -> Any:
    """Django's ``@task`` with celery-idem's options, on Django 6.0 (whose ``@task``
    refuses options it does not know) as on 6.1::

        from celery_idem.tasks_backend import task

        @task(idempotency_key="ship/{order_id}", atomic=True)
        def ship_order(order_id): ...

    ``backend`` must name a ``CeleryIdemBackend`` in ``TASKS``.
    """
    from django.tasks import task_backends

    def wrapper(func: Callable[..., Any]) -> CeleryIdemTask:
        task_class = task_backends[backend].task_class
        if not (isinstance(task_class, type) and issubclass(task_class, CeleryIdemTask)):
            raise ConfigurationError(
                f"celery_idem.tasks_backend.task declares tasks of CeleryIdemBackend, but "
                f"TASKS[{backend!r}] is {type(task_backends[backend]).__name__}: name a "
                "CeleryIdemBackend alias with backend=, or use django.tasks.task")
        declared: CeleryIdemTask = task_class(
            func=func, priority=priority, queue_name=queue_name, backend=backend,
            takes_context=takes_context, run_after=None, **options)
        return declared

    return wrapper(function) if function is not None else wrapper


class CeleryIdemBackend(BaseTaskBackend):
    """A ``django.tasks`` backend whose tasks run on Celery workers through celery-idem.

    ``TASKS = {"default": {"BACKEND": "celery_idem.tasks_backend.CeleryIdemBackend"}}``;
    ``QUEUES`` as Django has it (a queue name other than ``"default"`` is the Celery
    queue of that name). No ``OPTIONS``: the Celery app, its broker and celery-idem's
    settings are the project's own.
    """

    task_class = CeleryIdemTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        if self.options:
            raise ConfigurationError(
                f"TASKS[{alias!r}] gives CeleryIdemBackend OPTIONS {sorted(self.options)}, "
                "which it does not take: its settings are Celery's and celery-idem's own")
        self._worker_modules: frozenset[str] | None = None

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if not isinstance(task, CeleryIdemTask):
            raise InvalidTask(
                f"CeleryIdemBackend runs tasks of its own task class: declare "
                f"{task.module_path} with django.tasks.task (backend {self.alias!r}) or "
                "celery_idem.tasks_backend.task, not for another backend")
        if task.atomic == OPTIMISTIC:
            raise InvalidTask(
                f"{task.module_path}: atomic='optimistic' is for Celery tasks: a Django "
                "task's result and signals are the claim's; declare atomic=True")
        if task.atomic and iscoroutinefunction(task.func):
            raise InvalidTask(
                f"{task.module_path}: an atomic task must be a plain function: an async "
                "one's database calls run on other threads, outside the transaction of "
                "its claim")

    # -- enqueue -----------------------------------------------------------------------

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Publish ``task(*args, **kwargs)`` through celery-idem; its job's result.

        Raises (and sends nothing) for a task refused by its declaration or unknown to
        the workers (``ConfigurationError``), bad arguments or key (``ArgumentsNotJSON``,
        ``InvalidKey``, ``MissingKey``, ``TypeError``) and a key first used with other
        arguments (``KeyMismatch``). Returned, it runs once: inside
        ``transaction.atomic()`` on the job database once that commits.
        """
        self.validate_task(task)
        assert isinstance(task, CeleryIdemTask)
        self._check_known(task)
        if not durability.writes_intent():
            raise ConfigurationError(_BROKER_DURABILITY)
        celery_task = adapter.celery_task(task)
        spec = celery_task.key_spec()  # a misdeclared task's ConfigurationError
        options = self._routing(task)
        headers: dict[str, Any] = {}
        key = task.call_key or derived_key(spec, celery_task.name, args, kwargs, options,
                                           headers)
        intent = build_intent(spec, celery_task.namespace, celery_task.name, args, kwargs,
                              key)
        celery_task.apply_async(args, kwargs, idempotency_key=intent.key,
                                headers=headers or None, **options)
        job = results.read_key(intent.namespace, intent.key)
        if job is None:
            # Forgotten between its publish and this read: the worker refuses a message
            # whose intent is gone, so nothing runs.
            raise PersistenceError(f"the job of key {intent.key!r} vanished as it was "
                                   "enqueued (forgotten by an operator): nothing runs")
        result = results.build(task, self.alias, job)
        if in_transaction():
            transaction.on_commit(lambda: self._enqueued(result), using=settings.DATABASE)
        else:
            self._enqueued(result)
        return result

    def _enqueued(self, result: TaskResult) -> None:
        adapter.announce(task_enqueued, type(self), result)

    def _check_known(self, task: CeleryIdemTask) -> None:
        if self._worker_modules is None:
            self._worker_modules = discovery.worker_modules(current_app)
        why = discovery.unknown_to_workers(task, self._worker_modules)
        if why is not None:
            raise ConfigurationError(why)

    def _routing(self, task: CeleryIdemTask, broker_url: str | None = None) -> dict[str, Any]:
        """Celery's ``apply_async`` options for the task's queue, priority (on the broker
        of ``broker_url``, default the app's) and ``run_after``."""
        options: dict[str, Any] = {}
        if task.queue_name != DEFAULT_TASK_QUEUE_NAME:
            options["queue"] = task.queue_name  # else Celery's routes and default queue
        if broker_url is None:
            broker_url = current_app.conf.broker_url or ""
        priority = celery_priority(task.priority, broker_url)
        if priority is not None:
            options["priority"] = priority
        if task.run_after is not None:
            options["eta"] = task.run_after
        return options

    # -- results -----------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """The result of the job ``result_id`` names; ``TaskResultDoesNotExist`` for an
        id that names no job of a Django task (a plain Celery task's job is not one)."""
        job = results.read_result(result_id)
        declaration = adapter.declaration_named(job["task_name"]) if job else None
        if job is None or declaration is None:
            raise TaskResultDoesNotExist(result_id)
        return results.build(declaration, self.alias, job)


_BROKER_DURABILITY = (
    "a Django task's result is its job, which a publish writes only with "
    "CELERY_IDEM_DURABILITY = 'database' (the default); under 'broker' every enqueue raises")


def celery_priority(priority: int, broker_url: str) -> int | None:
    """Django's priority (-100 lowest to 100 highest) as Celery's on the broker of
    ``broker_url``: 0 to 9 with 9 the highest on RabbitMQ (a queue declared with
    ``x-max-priority``), 9 to 0 with 0 the highest on Redis (kombu's Redis transport groups
    them into its priority steps); None on a transport without priorities (the filesystem
    transport, SQS), where the queue stays first in, first out."""
    scheme = urlparse(broker_url).scheme
    # Ten bands of about twenty Django priorities: -100 to -80 is 0, 0 is 4, 81 to 100 is 9.
    rank = ((priority - TASK_MIN_PRIORITY) * CELERY_PRIORITIES
            // (TASK_MAX_PRIORITY - TASK_MIN_PRIORITY + 1))
    if scheme in AMQP_SCHEMES:
        return rank
    if scheme in REDIS_SCHEMES:
        return CELERY_PRIORITIES - 1 - rank
    return None


__all__ = ["CeleryIdemBackend", "CeleryIdemTask", "celery_priority", "task"]
