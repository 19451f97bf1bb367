"""``celery_idem.task``: the short declaration of an idempotent task."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

from celery import shared_task

from .errors import ConfigurationError
from .idempotent_task import IdempotentTask
from .keys import KeySpec, body_signature

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

    The key declaration is checked against the function's parameters here, when the
    task is declared: a key naming no parameter, or no key at all (``@celery_idem.task``
    without parentheses), raises :class:`~celery_idem.errors.ConfigurationError`.

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
    :raises ConfigurationError: no key, a key that does not fit the function, the key
        given twice, or a ``base`` that is not an IdempotentTask.
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

    def decorator(body: Callable[..., Any]) -> Any:
        # The check the task class makes when Celery creates it, made now: a shared
        # task's class is only made when an app finalizes, long after the import.
        name = options.get("name") or f"{body.__module__}.{body.__name__}"
        run = body if options.get("bind") else staticmethod(body)
        KeySpec(name, key, body_signature(run))
        return declare(body)

    return decorator if fn is None else decorator(fn)
