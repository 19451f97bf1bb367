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
import dis
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


#: ``atomic=OPTIMISTIC``: the body before any claim, its commit one insert of the
#: finished row (``runner.Run.optimistic``; docs/how-to/database-effects.md).
OPTIMISTIC = "optimistic"
#: ``atomic``'s values: off, claim first (``True``), or the body first.
ATOMIC_MODES = (False, True, OPTIMISTIC)
#: What a bound body may not use with ``atomic="optimistic"``: each needs the claim its
#: body runs without (the attempt number, the checkpoints and the lease it fences, the
#: claim a replacement takes over).
NEEDS_A_CLAIM = ("attempt", "step", "heartbeat", "replace")


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
    if cls.atomic not in ATOMIC_MODES:
        raise ConfigurationError(
            f"atomic must be True, False or 'optimistic', not {cls.atomic!r}")
    if cls.atomic == OPTIMISTIC:
        used = claim_uses(cls.__dict__.get("run"))
        if used:
            raise ConfigurationError(
                f"atomic='optimistic' runs the body before any claim, so it cannot use "
                f"{', '.join(f'self.{name}' for name in used)}: declare atomic=True")


def claim_uses(run: Any) -> list[str]:
    """The names of ``NEEDS_A_CLAIM`` that a bound body reads from its first parameter
    (``self.step``, ...), in its own code and its nested functions'; [] for a body that is
    not bound or not Python code. A static look, which a body that hands ``self`` to a
    helper escapes: there, the helper's call raises ConfigurationError at run time."""
    code = getattr(run, "__code__", None)  # a staticmethod (bind=False) has none
    if code is None or not code.co_argcount:
        return []
    own = code.co_varnames[0]
    found: set[str] = set()
    for block in _code_blocks(code):
        previous = None
        for instruction in dis.get_instructions(block):
            if (instruction.opname in ("LOAD_ATTR", "LOAD_METHOD")
                    and instruction.argval in NEEDS_A_CLAIM and previous is not None
                    and previous.opname in ("LOAD_FAST", "LOAD_DEREF", "LOAD_FAST_CHECK")
                    and previous.argval == own):
                found.add(instruction.argval)
            previous = instruction
    return sorted(found)


def _code_blocks(code: Any) -> list[Any]:
    blocks = [code]
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            blocks.extend(_code_blocks(const))
    return blocks
