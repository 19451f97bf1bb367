"""A task run through Celery's tracer in this process, as the worker's pool child runs it,
and the proposed changes prototyped in bench/lib/worker_app.py switched on around a block:
what the statements suite (bench/suites/statements.py, statement_loops.py) runs.
"""

from __future__ import annotations

import uuid
from typing import Any

#: The run's queue (protocol_cost.py configures kombu's in-memory transport for it).
QUEUE = "bench-protocol"

_tracers: dict[str, Any] = {}


def run_task(task: Any, args: tuple[Any, ...], key: str | None = None,
             task_id: str | None = None, retries: int = 0) -> Any:
    """Run ``task`` through Celery's tracer, as the worker's pool child does."""
    from celery.app.trace import build_tracer

    from bench.lib.worker_app import app
    from celery_idem.producer import KEY_HEADER as HEADER

    tracer = _tracers.get(task.name)
    if tracer is None:
        tracer = _tracers[task.name] = build_tracer(
            task.name, task, app=app, eager=False, propagate=False, hostname="bench@local")
    task_id = task_id or str(uuid.uuid4())
    request = {
        "id": task_id, "task": task.name, "retries": retries, "args": list(args),
        "kwargs": {}, "hostname": "bench@local", "is_eager": False,
        "delivery_info": {"exchange": "", "routing_key": QUEUE, "priority": 0,
                          "redelivered": False},
        "reply_to": None, "correlation_id": task_id, "timelimit": (None, None),
        "root_id": task_id, "parent_id": None,
    }
    if key is not None:
        request[HEADER] = key
        request["headers"] = {HEADER: key}
    out = tracer(task_id, list(args), {}, request)
    return out


def patched(fn: Any, names: tuple[str, ...] = ("prepared", "rodup", "dedfix")) -> float:
    """Run ``fn`` with the proposed changes prototyped in bench/lib/worker_app.py applied."""
    from bench.lib.worker_app import PATCHES

    undo = [PATCHES[name]() for name in names]
    try:
        return fn()
    finally:
        for u in undo:
            u()
