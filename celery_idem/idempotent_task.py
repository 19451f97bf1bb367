"""``IdempotentTask``: the Celery task base class that runs a body once per idempotency key.

This module holds the declaration (the task options, checked when the class is
created) and what the body sees (``self.idempotency_key``, ``self.attempt``,
``self.heartbeat()``, ``self.external_key()``). Sending is ``celery_idem.producer``'s
job, running a message ``celery_idem.runner``'s; docs/explanation/how-it-works.md follows one key
through both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

from celery import Task, current_app
from celery.contrib.django.task import DjangoTask
from celery.utils import uuid

from . import pools, replacement, runner, steps
from .backends import Intent
from .conf import settings
from .declaration import declare
from .errors import ArgumentsNotJSON, ConfigurationError, InvalidKey, ReservedAttribute
from .keys import KeySpec, body_signature, carry_key, no_key_per_item
from .producer import build_intent, send, write_eager_intent

#: Celery's built-in tasks that call a task's body directly, once per item.
MAP_TASKS = frozenset({"celery.map", "celery.starmap", "celery.chunks"})


class _DeclaredKey:
    """``idempotency_key``: the declaration on the class, the current key on an instance."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __get__(self, task: Any, owner: type | None = None) -> Any:
        if task is None:
            return self.source
        return getattr(task.request, "idempotency_key", None)


class IdempotentTask(DjangoTask):
    """A task whose effect happens once per idempotency key, whatever is redelivered.

    Task options (pass them to ``@shared_task(base=IdempotentTask, ...)``):

    - ``idempotency_key``: a template over the task's parameters (``"ship/{order_id}"``),
      a callable taking the task's arguments, ``ALL_ARGUMENTS`` or ``PER_CALL``. Required.
    - ``idempotency_namespace``: keys are unique per namespace; default the task's name.
    - ``atomic``: run claim, body and commit in one transaction on the job database;
      ``"optimistic"``: run the body first and commit with one insert of the finished row
      where the key has none (no ``self.attempt``, ``step``, ``heartbeat`` or ``replace``).
    - ``atomic_database``: the alias an atomic body writes to. Needed (and must equal
      ``CELERY_IDEM_DATABASE``) when the job tables are not on ``"default"``: the
      transaction covers the job database only, so writes elsewhere would not roll back.
    - ``on_in_progress``: what a duplicate does when it meets a live claim: ``"retry"``
      (wait, then replay the outcome), ``"ignore"`` or ``"raise"`` (InProgress).
    - ``on_stale_claim``: what happens to a claim whose worker vanished:
      ``"redispatch"`` or ``"uncertain"`` (leave it to an operator).
    - ``max_attempts``: claims before the key is dead-lettered.
    - ``lease``: seconds a claim lives without a heartbeat (default: the hard time
      limit plus a grace, else ``CELERY_IDEM_DEFAULT_LEASE``).
    """

    idempotency_key: ClassVar[Any] = None
    idempotency_namespace: ClassVar[str | None] = None
    atomic: ClassVar[bool | str] = False
    atomic_database: ClassVar[str | None] = None
    on_in_progress: ClassVar[str] = "retry"
    on_stale_claim: ClassVar[str] = "redispatch"
    max_attempts: ClassVar[int | None] = None
    lease: ClassVar[float | None] = None

    _key_spec: ClassVar[KeySpec | None] = None
    #: What is wrong with this task's declaration, if anything (``declaration``).
    _declaration_error: ClassVar[ConfigurationError | None] = None

    #: The worker's MainProcess hands a claim back at once when it loses the child that
    #: held it (see celery_idem.recovery.worker.IdempotentRequest).
    Request = "celery_idem.recovery.worker:IdempotentRequest"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("idempotency_key")
        if isinstance(declared, _DeclaredKey):
            return
        source = declared if "idempotency_key" in cls.__dict__ else cls.idempotency_key
        cls.idempotency_key = _DeclaredKey(source)
        if "run" not in cls.__dict__:
            return  # an abstract base: concrete tasks are checked when they define run
        name = cls.__dict__.get("name") or f"{cls.__module__}.{cls.__qualname__}"
        cls._key_spec, cls._declaration_error = declare(
            cls, name, source, body_signature(cls.__dict__["run"]))

    @classmethod
    def bind(cls, app: Any) -> Any:
        bound = super().bind(app)  # settles typing (None: the app's strict_typing)
        if cls._key_spec is not None:
            cls._key_spec.typed = cls.typing is not False
        return bound

    @classmethod
    def key_spec(cls) -> KeySpec:
        """The checked key declaration of this task; the declaration's ConfigurationError
        (naming the task and the fix) for a misdeclared one: its publishes raise it, and
        its messages fail with it on the worker without running."""
        if cls._declaration_error is not None:
            raise ConfigurationError(str(cls._declaration_error))
        if cls._key_spec is None:
            raise ConfigurationError(f"{cls.__name__} defines no task body")
        return cls._key_spec

    # -- what the body sees ------------------------------------------------------------

    @property
    def namespace(self) -> str:
        """The namespace in which this task's keys are unique."""
        return self.idempotency_namespace or str(self.name)

    @property
    def attempt(self) -> int | None:
        """The attempt number (fencing token) of the claim the body runs under."""
        claim = getattr(self.request, "_idem_claim", None)
        return claim.attempt if claim else None

    @attempt.setter
    def attempt(self, value: object) -> None:
        # A plain Celery task may keep its own counter as ``self.attempt`` (Celery's own
        # integration suite does): say what the name is here, not "no setter".
        raise ReservedAttribute(
            f"{self.name}: IdempotentTask.attempt is the attempt number of the claim the "
            "body runs under (its fencing token) and cannot be set; keep a counter of "
            "your own under another name, or read self.request.retries")

    def heartbeat(self, seconds: float | None = None) -> datetime:
        """Extend this attempt's lease; raises ClaimLost if a newer attempt owns the key."""
        claim = getattr(self.request, "_idem_claim", None)
        if claim is None:
            raise self._no_claim("heartbeat()")
        until: datetime = claim.heartbeat(seconds)
        return until

    def _no_claim(self, what: str) -> ConfigurationError:
        if getattr(self.request, "_idem_optimistic", False):
            return ConfigurationError(
                f"{self.name}: {what} needs a claim, and atomic='optimistic' runs the body "
                "before any: declare atomic=True")
        return ConfigurationError(f"{what} is only valid inside a running task body")

    def external_key(self, scope: str = "") -> str:
        """A key for an external API's own idempotency header, stable across attempts."""
        digest = hashlib.sha256(f"{self.namespace}\0{self.idempotency_key}\0{scope}".encode())
        return f"idem-{digest.hexdigest()[:40]}"

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once per job and step ``name``, and return its value.

        The value (JSON) is stored as the job's checkpoint, fenced by this attempt; any
        later attempt of the job gets it back without calling ``fn``. Raises StepNotJSON
        (nothing is stored) and ClaimLost (a newer attempt owns the key: nothing is
        stored, stop working). Called as a plain function (no claim), ``fn`` just runs.
        """
        steps.check_name(name)
        claim = getattr(self.request, "_idem_claim", None)
        if claim is None:
            if not self.request.called_directly:
                raise self._no_claim("step()")
            return steps.storable(name, fn(*args, **kwargs))
        return steps.run_step(claim, name, fn, args, kwargs)

    def effective_max_attempts(self) -> int:
        """max_attempts, else the setting, raised to cover the task's own max_retries."""
        if self.max_attempts is not None:
            return self.max_attempts
        return max(int(settings.MAX_ATTEMPTS), (self.max_retries or 0) + 1)

    def lease_seconds(self) -> float:
        """The lease: ``lease``, else the hard time limit plus a grace where the pool
        enforces it (prefork), else ``CELERY_IDEM_DEFAULT_LEASE``."""
        if self.lease is not None:
            return float(self.lease)
        hard = (self.request.timelimit or (None, None))[0] or self.time_limit
        if hard and pools.time_limits_enforced():
            return float(hard) + float(settings.LEASE_GRACE)
        return float(settings.DEFAULT_LEASE)

    def intent(self, args: Any = None, kwargs: Any = None, key: str | None = None) -> Intent:
        """The intent of one call: key, fingerprint and what to store. Raises bad input."""
        return build_intent(self.key_spec(), self.namespace, self.name, args, kwargs, key)

    # -- sending and running -------------------------------------------------------------

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: str | None = None, idempotency_key: str | None = None,
                    **options: Any) -> Any:
        """Send the task; ``idempotency_key=`` overrides the declared key for this call.

        Raises (before anything is sent) ArgumentsNotJSON, InvalidKey, MissingKey or
        KeyMismatch.
        """
        args, kwargs = self.sent_arguments(args, kwargs)

        def publish(final: dict[str, Any]) -> Any:
            return super(IdempotentTask, self).apply_async(
                args, kwargs, link=link, link_error=link_error, shadow=shadow, **final)

        return send(self, args, kwargs, {**options, "task_id": task_id, "producer": producer},
                    idempotency_key, publish)

    def apply(self, args: Any = None, kwargs: Any = None, *more: Any,
              idempotency_key: str | None = None, **options: Any) -> Any:
        """Celery's eager ``apply``; ``idempotency_key=`` overrides the declared key.

        With a key (given, or declared by a template, a callable or ALL_ARGUMENTS) the call
        claims it and commits like a worker, so it runs once per key. A ``PER_CALL`` task
        applied without one has no key: its body runs as a plain call, writing no row.
        """
        carry_key(options, idempotency_key)
        write_eager_intent(self.name, options.get("task_id"))  # apply_async made eager
        args, kwargs = self.sent_arguments(args, kwargs)
        return super().apply(args, kwargs, *more, **options)

    def sent_arguments(self, args: Any, kwargs: Any) -> tuple[Any, Any]:
        """The arguments as the message carries them: a ``pydantic=True`` task's models
        dumped to JSON as Celery (5.7+) dumps them before sending, so the intent stores and
        fingerprints what the worker receives (and validates back into models)."""
        dump = getattr(self, "_dump_pydantic_arguments", None)
        if dump is None:
            return args, kwargs
        dumped: tuple[Any, Any] = dump(args, kwargs)
        return dumped

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """``delay`` whose message leaves when the transaction on the job database commits.

        Unlike ``DjangoTask``'s, the intent is written now, in the transaction (bad input
        raises here, and a producer that dies after the commit loses nothing): the
        outbox of ``apply_async`` (docs/explanation/how-it-works.md, "Transactions").
        """
        self.apply_async(args, kwargs)

    def apply_async_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """``apply_async`` whose message leaves on commit; see ``delay_on_commit``."""
        self.apply_async(*args, **kwargs)

    # Celery's builtins call the body once per item in their own process, where each item
    # claims the key its arguments make (__call__ below): a PER_CALL task has none to give,
    # so the signature is refused when it is made, not when the worker runs it.
    def map(self, it: Any) -> Any:
        self._refuse_items_without_a_key("map")
        return super().map(it)

    def starmap(self, it: Any) -> Any:
        self._refuse_items_without_a_key("starmap")
        return super().starmap(it)

    def chunks(self, it: Any, n: int) -> Any:
        self._refuse_items_without_a_key("chunks")
        return super().chunks(it, n)

    def _refuse_items_without_a_key(self, builtin: str) -> None:
        if self.key_spec().per_call:
            raise no_key_per_item(self.name, builtin)

    def replace(self, sig: Any) -> Any:
        """Celery's ``replace``; the key's outcome becomes the replacement's (see
        celery_idem.replacement): the replaced body never runs again for this key."""
        if getattr(self.request, "_idem_optimistic", False):
            raise self._no_claim("replace()")
        return super().replace(replacement.replacement(self, sig))

    def on_replace(self, sig: Any) -> Any:
        replacement.hand_over(self, sig)  # raises when a claim is handed over
        return super().on_replace(sig)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.request.called_directly:
            # The tracer (worker and eager alike) pushed this message's request and the
            # task: the body runs under them, as a plain Celery task's does, where
            # Task.__call__ would push a copy of the request first (about 72,000
            # instructions a task). A base class defining __call__ after this one runs.
            return runner.run(self, args, kwargs,
                              self.run if _calls_run(type(self)) else super().__call__)
        body = super().__call__
        parent = current_app.current_worker_task
        if parent is not None and parent.name in MAP_TASKS:
            # Celery's map/starmap/chunks call each item in the map task's own process
            # (celery/app/builtins.py): each item claims its key like a message would.
            self.push_request(id=uuid(), called_directly=False, is_eager=parent.request.is_eager,
                              hostname=parent.request.hostname, headers=None,
                              _idem_map_task=parent)
            try:
                return runner.run(self, args, kwargs, body)
            finally:
                self.pop_request()
        # A plain function call (a unit test of the body; Celery calling a link_error
        # errback in the failing task's worker): no claim, no commit, but the body still
        # sees the key it would run under.
        self.push_request(idempotency_key=self._direct_key(args, kwargs))
        try:
            return body(*args, **kwargs)
        finally:
            self.pop_request()

    def _direct_key(self, args: Any, kwargs: Any) -> str | None:
        """The key a direct call's arguments make; None for a ``PER_CALL`` task, and where
        they make none (not JSON, or not what the template names): such a call claims
        nothing, so it runs as the plain function Celery calls, whose arguments are only
        refused where they would be stored, at a publish."""
        if self.key_spec().per_call:
            return None
        try:
            return self.intent(args, kwargs).key
        except (ArgumentsNotJSON, InvalidKey):
            return None


#: Per task class, what ``_calls_run`` found.
_CALLS_RUN: dict[type, bool] = {}


def _calls_run(cls: type) -> bool:
    """Whether the ``__call__`` after ``IdempotentTask``'s in ``cls``'s order is Celery's
    own ``Task.__call__``, which only pushes a request and calls ``run``."""
    found = _CALLS_RUN.get(cls)
    if found is None:
        mro = cls.__mro__
        after = [base.__dict__["__call__"] for base in mro[mro.index(IdempotentTask) + 1:]
                 if "__call__" in base.__dict__]
        found = _CALLS_RUN[cls] = bool(after) and after[0] is Task.__call__
    return found


__all__ = ["IdempotentTask"]
