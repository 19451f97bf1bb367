"""Where a task's idempotency key comes from, and what makes a key valid.

A task declares one of: a format template over its parameters (``"ship/{order_id}"``), a
callable taking the task's arguments, ``ALL_ARGUMENTS`` (the key is the arguments'
fingerprint) or ``PER_CALL`` (every call passes ``idempotency_key=``). The declaration is
checked when the task class is created; a typo in a template refuses that task alone, by name
(``declaration``).
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable
from typing import Any, Final

from .errors import ConfigurationError, InvalidKey, MissingKey
from .fingerprints import fingerprint

#: Message header that carries the idempotency key from producer to worker.
KEY_HEADER = "celery_idem_key"

#: Length of the key column; longer keys are refused at publish.
KEY_MAX_LENGTH: Final = 255


class _KeySource(str):
    """A named constant a task can give as its key source."""

    def __repr__(self) -> str:
        return f"celery_idem.{self}"


#: The key is the fingerprint of all the task's arguments.
ALL_ARGUMENTS: Final = _KeySource("ALL_ARGUMENTS")
#: Every call must pass ``apply_async(..., idempotency_key=...)``.
PER_CALL: Final = _KeySource("PER_CALL")

KeySourceType = str | Callable[..., str]

#: The names of a ``typing=False`` call's arguments that do not fit its signature.
UNBOUND_ARGS: Final = "*"
UNBOUND_KWARGS: Final = "**"


def validate_key(key: Any) -> str:
    """Return ``key`` if it is a usable key, else raise InvalidKey."""
    if not isinstance(key, str):
        raise InvalidKey(f"an idempotency key must be a str, not {type(key).__name__}")
    if not key.strip():
        raise InvalidKey("an idempotency key must not be empty")
    if "\x00" in key:
        # PostgreSQL cannot store it in a text column; fail here, not in the database.
        raise InvalidKey(f"idempotency key {key!r:.80} contains a NUL character (\\u0000)")
    if len(key) > KEY_MAX_LENGTH:
        raise InvalidKey(
            f"idempotency key is {len(key)} characters; the most is {KEY_MAX_LENGTH}: "
            "use ALL_ARGUMENTS or hash the long part"
        )
    return key


def carry_key(options: dict[str, Any], key: str | None) -> None:
    """Put ``key`` (checked) in the ``KEY_HEADER`` of the publish ``options``, if given:
    how ``send_task`` and an eager ``apply`` take ``idempotency_key=``."""
    if key is not None:
        options["headers"] = {**(options.get("headers") or {}), KEY_HEADER: validate_key(key)}


def missing_key(task_name: str) -> MissingKey:
    """The error of a ``PER_CALL`` task sent without a key, naming the ways to give one."""
    return MissingKey(
        f"task {task_name} takes its idempotency key per call: pass "
        "apply_async(..., idempotency_key=...) or app.send_task(..., idempotency_key=...)"
    )


def no_key_per_item(task_name: str, builtin: str) -> MissingKey:
    """The error of Celery's ``map``/``starmap``/``chunks`` over a ``PER_CALL`` task: the
    builtin calls the body once per item, and no caller is there to give an item its key."""
    return MissingKey(
        f"task {task_name} takes its idempotency key per call, and its {builtin}() would "
        "call it once per item with no key of its own: publish the items as a group, "
        "each with apply_async(..., idempotency_key=...), or declare a key the arguments "
        "make (a template, a callable or ALL_ARGUMENTS)")


class KeySpec:
    """A task's key declaration, checked against the signature of its body."""

    def __init__(self, task_name: str, source: Any, signature: inspect.Signature) -> None:
        self.task_name = task_name
        self.signature = signature
        self.source = source
        #: False for a task declared ``typing=False`` (IdempotentTask.bind sets it).
        self.typed = True
        self._simple = _simple_parameters(signature)
        if source is None:
            raise ConfigurationError(
                f"task {task_name} declares no idempotency_key: give a template such as "
                '"order/{order_id}", a callable, celery_idem.ALL_ARGUMENTS or '
                "celery_idem.PER_CALL"
            )
        if isinstance(source, _KeySource) or callable(source):
            return
        if not isinstance(source, str):
            raise ConfigurationError(
                f"task {task_name}: idempotency_key must be a template, a callable, "
                f"ALL_ARGUMENTS or PER_CALL, not {type(source).__name__}"
            )
        self._check_template(source)

    def _check_template(self, template: str) -> None:
        fields = check_template(self.task_name, template, self.signature, "key")
        if not fields:
            raise ConfigurationError(
                f"task {self.task_name}: key template {template!r} names no argument, so "
                "every call would share one key; use PER_CALL if that is what you mean"
            )

    @property
    def per_call(self) -> bool:
        return self.source is PER_CALL

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The arguments by parameter name, defaults applied (what the fingerprint covers).

        A call that does not fit the signature raises TypeError at publish, as Celery's
        own check does; under ``typing=False`` Celery leaves that to the body on the
        worker, so its arguments are kept as given (``UNBOUND_ARGS``/``UNBOUND_KWARGS``,
        no parameter can have those names) and the body raises its TypeError there.
        """
        if self._simple is not None:
            fast = _bind_simple(self._simple, args, kwargs)
            if fast is not None:
                return fast
        # Anything else (and every call that does not fit, for its TypeError): inspect's.
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            if self.typed:
                raise
            return {UNBOUND_ARGS: list(args), UNBOUND_KWARGS: dict(kwargs)}
        bound.apply_defaults()
        return dict(bound.arguments)

    def key(self, bound: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The key for one call; raises MissingKey for a PER_CALL task."""
        source = self.source
        if source is PER_CALL:
            raise missing_key(self.task_name)
        if source is ALL_ARGUMENTS:
            return fingerprint(bound)
        if isinstance(source, str):
            try:
                return validate_key(source.format(**bound))
            except (KeyError, IndexError, AttributeError) as exc:
                raise InvalidKey(
                    f"task {self.task_name}: key template {source!r} failed on these "
                    f"arguments: {exc!r}"
                ) from exc
        return validate_key(source(*args, **kwargs))


#: (name, default, positional) of each parameter of a body without */**/positional-only.
_Simple = tuple[tuple[str, Any, bool], ...]


def _simple_parameters(signature: inspect.Signature) -> _Simple | None:
    """The parameters, when ``_bind_simple`` can bind them as ``Signature.bind`` would
    (no ``*args``, ``**kwargs`` or positional-only ones); else None."""
    params = signature.parameters.values()
    simple = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(p.kind not in simple for p in params):
        return None
    return tuple((p.name, p.default, p.kind is simple[0]) for p in params)


def _bind_simple(params: _Simple, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``Signature.bind(*args, **kwargs)`` with defaults applied, in parameter order,
    without inspect's generality (the hot path of every publish and every task); None
    when the call does not bind (inspect then raises its usual TypeError)."""
    bound: dict[str, Any] = {}
    used = named = 0
    for name, default, positional in params:
        if positional and used < len(args):
            if name in kwargs:
                return None  # given twice
            bound[name] = args[used]
            used += 1
        elif name in kwargs:
            bound[name] = kwargs[name]
            named += 1
        elif default is not inspect.Parameter.empty:
            bound[name] = default
        else:
            return None  # missing
    if used < len(args) or named < len(kwargs):
        return None  # too many positional arguments, or an unknown keyword
    return bound


def check_template(task_name: str, template: str, signature: inspect.Signature,
                   what: str) -> list[str]:
    """The fields of a format ``template`` over a task's parameters (a key, a shard
    name), each checked to name a parameter; a bad one is a ConfigurationError."""
    params = signature.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ConfigurationError(f"task {task_name}: bad {what} template: {exc}") from exc
    for field in fields:
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise ConfigurationError(
                f"task {task_name}: {what} template fields must name parameters, "
                f"got {{{field}}}"
            )
        if root not in params and not takes_any:
            raise ConfigurationError(
                f"task {task_name}: {what} template names {root!r}, which is not a "
                f"parameter of the task (it has: {', '.join(params) or 'none'})"
            )
    return fields


def body_signature(run: Any) -> inspect.Signature:
    """The signature a caller uses for ``run`` as it sits in a task class's namespace."""
    if isinstance(run, staticmethod):
        return inspect.signature(run.__func__)
    signature = inspect.signature(run)
    params = list(signature.parameters.values())
    return signature.replace(parameters=params[1:])  # drop self / the bound task
