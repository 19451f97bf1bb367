"""Step checkpoints: ``IdempotentTask.step`` runs a piece of the body once per job.

A step's JSON value is stored as a ``Checkpoint`` of the job, fenced by the attempt that
computed it (``Backend.save_step``, the ``step_completed`` move): an attempt that lost its
claim cannot add or overwrite a step of the newer one. Any later attempt of the job gets
the stored value back without calling the step again. The write goes through the claim's
own backend, so in an ``atomic=True`` body it is part of the body's transaction (and
rolls back with it), and in the default mode it commits at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils import timezone

from .backends import Change
from .claims import Claim
from .errors import ArgumentsNotJSON, ClaimLost, InvalidStep, StepNotJSON
from .fingerprints import check_json
from .persistence import persistence
from .states import STEP_COMPLETED, State, StepWrite

#: The longest step name (the checkpoint's ``step`` column).
STEP_MAX_LENGTH = 200


def check_name(name: Any) -> str:
    """``name`` if it can name a step; else InvalidStep."""
    if not isinstance(name, str) or not name or len(name) > STEP_MAX_LENGTH:
        raise InvalidStep(f"a step name must be a non-empty string of at most "
                          f"{STEP_MAX_LENGTH} characters, not {name!r:.80}")
    return name


def storable(name: str, value: Any) -> Any:
    """``value`` if it can be stored as step ``name``'s checkpoint; else StepNotJSON."""
    try:
        check_json(value, f"the value of step {name!r}")
    except ArgumentsNotJSON as exc:
        raise StepNotJSON(str(exc)) from exc
    return value


def run_step(claim: Claim, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
    """The stored value of step ``name`` of the claim's job, else ``fn``'s, stored."""
    with persistence():
        found, value = claim.backend.read_step(claim.job_id, name)
    if found:
        return value
    value = storable(name, fn(*args, **kwargs))
    change = Change(claim.job_id, STEP_COMPLETED, State.RUNNING, attempt=claim.attempt,
                    worker=claim.worker, task_id=claim.task_id, reason=f"step {name!r}",
                    task_name=claim.task_name)
    with persistence():
        written = claim.backend.save_step(change, name, value, timezone.now())
        if written is StepWrite.EXISTS:
            # Stored meanwhile by this same attempt (a step run twice at once): that stands.
            return claim.backend.read_step(claim.job_id, name)[1]
    if written is StepWrite.FENCED:
        raise ClaimLost(f"attempt {claim.attempt} of job {claim.job_id} lost its claim: "
                        f"step {name!r} was not stored")
    return value
