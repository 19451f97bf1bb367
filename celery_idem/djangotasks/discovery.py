"""Which modules the worker imports, so that it knows every Django task it is sent.

A Celery worker knows the tasks of the modules it imports when it starts, and discards a
message of any other task. It imports each installed app's ``tasks`` module (Celery's
``app.autodiscover_tasks()``, which celery-idem's setup asks for) and the modules of
Celery's ``imports`` and ``include`` settings (``CELERY_IMPORTS``). A Django task
declared in one of those is known to every worker with nothing registered by hand; one
declared anywhere else would be discarded, so its enqueue is refused
(``ConfigurationError``, nothing sent) and ``manage.py check`` reports it (E050).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core import checks
from django.utils.module_loading import module_has_submodule

from ..check_ids import CHECKS
from .adapter import DECLARED

#: The module Celery's autodiscovery imports from every installed app.
TASKS_MODULE = "tasks"


def worker_modules(app: Any) -> frozenset[str]:
    """The modules a worker of the Celery ``app`` imports when it starts."""
    found = {f"{config.name}.{TASKS_MODULE}" for config in apps.get_app_configs()
             if module_has_submodule(config.module, TASKS_MODULE)}
    for setting in (app.conf.imports, app.conf.include):
        found.update([setting] if isinstance(setting, str) else setting or ())
    return frozenset(found)


def unknown_to_workers(declaration: Any, modules: frozenset[str]) -> str | None:
    """Why a worker would not know ``declaration``, or None."""
    module = declaration.func.__module__
    if module in modules:
        return None
    app = apps.get_containing_app_config(module)
    move = f"move it to {app.name}.{TASKS_MODULE}, or " if app is not None else ""
    return (f"Django task {declaration.module_path} is declared in module {module}, which "
            f"the worker does not import, so it would discard the task's messages: {move}"
            f"add {module!r} to Celery's imports (CELERY_IMPORTS)")


def check(app: Any) -> list[checks.CheckMessage]:
    """E050: every Django task this process has imported that a worker would not know."""
    if not DECLARED:
        return []
    modules = worker_modules(app)
    return [CHECKS["E050"](why) for declaration in DECLARED.values()
            if (why := unknown_to_workers(declaration, modules)) is not None]
