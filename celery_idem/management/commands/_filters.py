"""Validation shared by the celery-idem management commands: bad filters fail clearly."""

from __future__ import annotations

import difflib
from typing import Any

from celery import current_app
from django.core.management.base import CommandError
from django.db.models import Q

from celery_idem.models import Job


def positive(value: Any, option: str) -> Any:
    """``value`` if it is above zero; else a CommandError naming ``option``."""
    if value is not None and value <= 0:
        raise CommandError(f"{option} must be greater than 0, not {value}")
    return value


def known_task_names(using: str) -> set[str]:
    registered = {name for name, task in current_app.tasks.items()
                  if getattr(task, "key_spec", None) is not None}
    stored = set(Job.objects.using(using).values_list("task_name", flat=True).distinct())
    return registered | stored


def task_filter(name: str | None, using: str) -> Q:
    """Jobs of task ``name``; a name neither registered nor stored is a CommandError."""
    if name is None:
        return Q()
    known = known_task_names(using)
    if name not in known:
        close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else \
            f"; known tasks: {', '.join(sorted(known)) or 'none'}"
        raise CommandError(f"no idempotent task named {name!r}{hint}")
    return Q(task_name=name)


def text_filter(value: str | None, option: str) -> str | None:
    """A non-blank filter text, stripped; a blank one is a CommandError."""
    if value is None:
        return None
    if not value.strip():
        raise CommandError(f"{option} must not be empty")
    return value.strip()
