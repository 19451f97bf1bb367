"""What a body's Celery retry (``raise self.retry(...)``) records on its job: when the
retry may run, and the arguments it goes on with.

``self.retry(args=..., kwargs=...)`` with new arguments is the same logical job: its key
stays (the retry's message carries it), and the ``retry_scheduled`` move writes the new
fingerprint and stored arguments, fenced by the attempt that retried. The retry's message
then claims the next attempt with them; a duplicate with the arguments of before is
another call under the same key (KeyMismatch).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from celery.exceptions import Retry
from django.utils import timezone

from .backends import Intent
from .producer import build_intent


def eta(exc: Retry) -> datetime | None:
    """When the retry's message may run, if it says."""
    when = exc.when
    if isinstance(when, datetime):
        return when
    if isinstance(when, int | float):
        return timezone.now() + timedelta(seconds=when)
    return None


def new_arguments(task: Any, intent: Intent, args: tuple[Any, ...], kwargs: dict[str, Any],
                  exc: Retry) -> dict[str, Any]:
    """The retry's new arguments as the columns ``retry_scheduled`` writes (fingerprint,
    stored arguments), checked as at publish; empty when the retry keeps ``args`` and
    ``kwargs``."""
    sig = getattr(exc, "sig", None)
    if sig is None:
        return {}
    new_args, new_kwargs = tuple(sig.args or ()), dict(sig.kwargs or {})
    if new_args == tuple(args) and new_kwargs == kwargs:
        return {}
    new = build_intent(task.key_spec(), task.namespace, task.name, new_args, new_kwargs,
                       intent.key)
    return {"fingerprint": new.fingerprint, "args": new.args, "kwargs": new.kwargs}
