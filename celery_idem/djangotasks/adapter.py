"""Each Django task as a Celery task that celery-idem runs: its *adapter*.

Declaring a task with ``CeleryIdemBackend``'s task class registers, in the process that
imports its module, a shared Celery task named by the Django task's module path
(``shop.tasks.ship_order``) whose base is an ``IdempotentTask`` declared with the
Django task's options (``idempotency_key``, ``atomic``, ...). Every Celery app of the
process knows it, so the worker runs it, and the recovery pass, the admin,
``idem_status`` and the metrics see its jobs under that name like any other.

On the worker the adapter runs the Django function under the claim: it sends
``task_started`` once the claim is won (the body runs), passes a ``TaskContext`` to a
task that takes one, and sends ``task_finished`` once the outcome is committed (a
duplicate that only replays sends neither). A signal's receivers never change an
outcome: their errors are logged (``send_robust``).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, ClassVar

from celery import shared_task
from celery.exceptions import Retry
from django.dispatch import Signal
from django.tasks import TaskContext
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from ..declaration import OPTIONS
from ..errors import ConfigurationError
from ..idempotent_task import IdempotentTask
from . import results

logger = logging.getLogger(__name__)

#: Every Django task declared with the backend's task class in this process, by module
#: path (its adapter's name): the first declaration of each (``.using()`` copies share it).
DECLARED: dict[str, Any] = {}

class _Run:
    """What the adapter's ``__call__`` learns from its body (which runs under a copy of
    the request): the job whose claim it ran under, if it ran."""

    job_id: int | None = None


class DjangoTaskAdapter(IdempotentTask):
    """The base of every Django task's adapter (an abstract IdempotentTask: no body)."""

    #: Results are read from the job row; Celery's result backend has nothing to add,
    #: and with nothing to read a finished key's duplicate enqueue sends no message.
    ignore_result = True
    #: The Django task this adapter runs (set per adapter).
    declaration: ClassVar[Any] = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.called_directly:
            return super().__call__(*args, **kwargs)
        run = self.request._idem_django_run = _Run()
        try:
            value = super().__call__(*args, **kwargs)
        except Retry:
            raise  # waits or a handed-back claim: the task is not finished
        except BaseException:
            _finished(self.declaration, run)  # inside the handler: receivers see exc_info
            raise
        _finished(self.declaration, run)
        return value


def register(declaration: Any) -> None:
    """Register the adapter of ``declaration`` (once per module path and process)."""
    name = declaration.module_path
    if name in DECLARED:
        return
    DECLARED[name] = declaration
    # IdempotentTask's options as the declaration gives them; None: IdempotentTask's default.
    options = {option: value for option in sorted(OPTIONS)
               if (value := getattr(declaration, option)) is not None}
    shared_task(base=DjangoTaskAdapter, bind=True, name=name, declaration=declaration,
                **options)(_body(declaration))


def celery_task(declaration: Any) -> Any:
    """The adapter of ``declaration`` on the current Celery app."""
    from celery import current_app

    register(declaration)
    found = current_app.tasks[declaration.module_path]
    if not isinstance(found, DjangoTaskAdapter):
        raise ConfigurationError(
            f"Django task {declaration.module_path} shares its name with the Celery task "
            f"{found!r}: give that one another name=")
    return found


def declaration_named(name: str) -> Any:
    """The Django task whose adapter is called ``name``, importing its module if this
    process has not; None when ``name`` is not such a task (a plain Celery task's job)."""
    if name not in DECLARED:
        try:
            import_string(name)  # declaring it registers it
        except ImportError:
            return None
    return DECLARED.get(name)


def _body(declaration: Any) -> Any:
    """The adapter's ``run``: the Django function's parameters (without ``context``),
    so keys, fingerprints and Celery's argument check see the function's own."""
    def run(adapter: Any, *args: Any, **kwargs: Any) -> Any:
        return _execute(adapter, declaration, args, kwargs)

    params = list(inspect.signature(declaration.func).parameters.values())
    if declaration.takes_context:
        params = params[1:]
    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("__adapter", inspect.Parameter.POSITIONAL_ONLY), *params])
    run.__name__ = declaration.func.__name__
    run.__qualname__ = declaration.func.__qualname__
    run.__module__ = declaration.func.__module__
    run.__doc__ = declaration.func.__doc__
    return run


def _execute(adapter: Any, declaration: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
    """Run the Django function under the claim the runner won."""
    claim = adapter.request._idem_claim
    run = adapter.request.get("_idem_django_run")
    if run is not None:
        run.job_id = claim.job_id
    backend = declaration.get_backend()
    started = results.build(declaration, backend.alias, _row(claim.job_id))
    announce(task_started, type(backend), started)
    if declaration.takes_context:
        value = declaration.call(TaskContext(task_result=started), *args, **kwargs)
    else:
        value = declaration.call(*args, **kwargs)
    return normalize_json(value)


def _row(job_id: int) -> dict[str, Any]:
    row = results.read(job_id)
    if row is None:  # the claim holds the row: only an operator's forget removes it
        raise LookupError(f"job {job_id} vanished under its claim")
    return row


def _finished(declaration: Any, run: _Run) -> None:
    """Send ``task_finished`` if the body ran and the job's outcome is committed."""
    if run.job_id is None:
        return  # a duplicate that replayed, or a wait: nothing ran here
    try:
        row = results.read(run.job_id)
        backend = declaration.get_backend()
        if row is None:
            return
        result = results.build(declaration, backend.alias, row)
    except Exception:
        logger.exception("could not read job %s for task_finished", run.job_id,
                         extra={"action": "django_task_finished_unread", "job_id": run.job_id})
        return
    if result.is_finished:
        announce(task_finished, type(backend), result)


def announce(signal: Signal, sender: type, result: Any) -> None:
    """Send Django's task ``signal``; a receiver's error is logged, never raised (the
    outcome it reports is already decided)."""
    for receiver, response in signal.send_robust(sender=sender, task_result=result):
        if isinstance(response, Exception):
            logger.error("a receiver of a Django task signal failed (%r): %s", receiver,
                         response, exc_info=response,
                         extra={"action": "django_task_signal_failed", "result_id": result.id})
