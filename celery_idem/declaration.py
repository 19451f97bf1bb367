"""A task's declaration, checked when its class is created: its ``idempotency_*`` options,
its policies and its key (``keys.KeySpec``).

A misdeclared task is still created, with its error kept: raised at class creation it
would stop the Celery app's finalize, and with it every task of the process (every
``delay()`` would raise, and the worker would refuse to start). Kept, it refuses that task
alone, by name: ``IdempotentTask.key_spec`` raises it, so its publishes raise and its
messages fail on the worker without running; check ``celery_idem.E001`` reports it.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from .errors import ConfigurationError
from .keys import KeySpec

IN_PROGRESS_POLICIES = ("retry", "ignore", "raise")
STALE_CLAIM_POLICIES = ("redispatch", "uncertain")
#: The task options celery-idem reads; other ``idempotency_*`` names are typos.
OPTIONS = frozenset({
    "idempotency_key", "idempotency_namespace", "atomic", "on_in_progress",
    "on_stale_claim", "max_attempts", "lease", "atomic_database",
})


def declare(cls: Any, name: str, source: Any,
            signature: inspect.Signature) -> tuple[KeySpec | None, ConfigurationError | None]:
    """The key declaration of task class ``cls`` called ``name``, or the error that
    refuses it (naming the task and the fix)."""
    try:
        check_options(cls)
        return KeySpec(name, source, signature), None
    except ConfigurationError as exc:
        said = str(exc) if name in str(exc) else f"task {name}: {exc}"
        return None, ConfigurationError(
            f"{said} (the task is refused until its declaration is fixed; manage.py check "
            "reports it as celery_idem.E001)")


def check_options(cls: Any) -> None:
    """ConfigurationError for an unknown ``idempotency_*`` option or a bad policy."""
    for attr in vars(cls):
        if attr.startswith("idempotency_") and attr not in OPTIONS:
            hint = difflib.get_close_matches(attr, OPTIONS, n=1)
            raise ConfigurationError(
                f"unknown task option {attr!r}" + (f": did you mean {hint[0]!r}?" if hint else ""))
    if cls.on_in_progress not in IN_PROGRESS_POLICIES:
        raise ConfigurationError(
            f"on_in_progress must be one of {IN_PROGRESS_POLICIES}, not {cls.on_in_progress!r}")
    if cls.on_stale_claim not in STALE_CLAIM_POLICIES:
        raise ConfigurationError(
            f"on_stale_claim must be one of {STALE_CLAIM_POLICIES}, not {cls.on_stale_claim!r}")
    if cls.max_attempts is not None and cls.max_attempts < 1:
        raise ConfigurationError("max_attempts must be at least 1")
