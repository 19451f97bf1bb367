"""``celery_idem.task``: the short declaration of an idempotent task."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

from celery import shared_task

from .errors import ConfigurationError
from .idempotent_task import IdempotentTask

Decorator = Callable[[Callable[..., Any]], Any]


@overload
def task(fn: None = None, /, *, key: Any = None, app: Any = None,
         **options: Any) -> Decorator: ...


@overload
def task(fn: Callable[..., Any], /, *, key: Any = None, app: Any = None,
         **options: Any) -> Any: ...


def task(fn: Callable[..., Any] | None = None, /, *, key: Any = None, app: Any = None,
         **options: Any) -> Any:
    """Declare a Celery task whose effect happens once per idempotency key.

    The short form of Celery's own declaration for the common case::

        import celery_idem

        @celery_idem.task(key="ship/{order_id}")
        def ship_order(order_id):
            ...

    is ``@shared_task(base=IdempotentTask, idempotency_key="ship/{order_id}")``, and
    every other option goes to Celery as given. As in Celery, ``bind`` defaults to
    ``False``: pass ``bind=True`` for a body that takes the task as ``self`` (to use
    ``self.external_key()``, ``self.step()``, ``self.attempt`` or ``self.heartbeat()``).

    A key that does not fit the function (a template naming no parameter), or no key at
    all (``@celery_idem.task`` without parentheses), refuses that task alone, as any
    misdeclared IdempotentTask is: its publishes raise
    :class:`~celery_idem.errors.ConfigurationError` naming it and the fix, its messages
    fail on the worker without running, and ``manage.py check`` reports it
    (``celery_idem.E001``); every other task still publishes and the worker starts.

    :param key: where the key comes from, as ``idempotency_key`` takes it: a template
        over the task's parameters (``"ship/{order_id}"``), a callable taking the task's
        arguments, :data:`celery_idem.ALL_ARGUMENTS` or :data:`celery_idem.PER_CALL`.
    :param app: declare the task on this Celery app only (``app.task``); by default it
        is a shared task, registered on every app.
    :param options: Celery's task options (``bind``, ``name``, ``queue``,
        ``max_retries``, ...) and IdempotentTask's (``atomic``, ``atomic_database``,
        ``on_in_progress``, ``on_stale_claim``, ``max_attempts``, ``lease``,
        ``idempotency_namespace``). ``base`` may name a subclass of IdempotentTask.
    :returns: the task, or, called without ``fn``, a decorator that makes it.
    :raises ConfigurationError: a misuse of this call: the key given positionally or
        twice, or a ``base`` that is not an IdempotentTask.
    """
    if fn is not None and not callable(fn):
        raise ConfigurationError(
            f"celery_idem.task takes the key by name: @celery_idem.task(key={fn!r})")
    if "idempotency_key" in options:
        raise ConfigurationError(
            "celery_idem.task takes the key as key=, not idempotency_key=")
    base = options.pop("base", IdempotentTask)
    if not (isinstance(base, type) and issubclass(base, IdempotentTask)):
        raise ConfigurationError(
            f"celery_idem.task declares an IdempotentTask: base= must be a subclass of "
            f"it, not {base!r}")
    declare = (shared_task if app is None else app.task)(
        base=base, idempotency_key=key, **options)
    return declare if fn is None else declare(fn)
