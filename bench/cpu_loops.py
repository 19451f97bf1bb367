"""bench/cpu_profile.py's loops: publishing through one producer, with each message kept,
and running each kept message through Celery's tracer as a pool child would."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Sent:
    """Captures what each publish handed the broker (the worker side runs it)."""

    def __init__(self) -> None:
        self.messages: list[tuple[dict[str, Any], Any]] = []

    def __call__(self, sender: Any = None, headers: Any = None, body: Any = None,
                 **_: Any) -> None:
        self.messages.append((dict(headers or {}), body))


def publish_loop(task: Any, ids: list[int], queue: str) -> Callable[[], None]:
    from bench.worker_app import app

    def loop() -> None:
        with app.producer_or_acquire() as producer:
            for i in ids:
                task.apply_async((i, 12.5), {"note": "gift"}, queue=queue, producer=producer)
    return loop


_tracers: dict[str, Any] = {}


def task_loop(task: Any, messages: list[tuple[dict[str, Any], Any]],
              queue: str) -> Callable[[], None]:
    """Run each message as a pool child would: the tracer, with the worker's request."""
    from celery.app.trace import build_tracer

    from bench.worker_app import app

    task = app.tasks[task.name]  # the task itself, as a worker has it (not a proxy)
    tracer = _tracers.get(task.name)
    if tracer is None:
        tracer = _tracers[task.name] = build_tracer(
            task.name, task, app=app, eager=False, propagate=True, hostname="cpu@local")
    requests = []
    for headers, body in messages:
        args, kwargs, embed = body
        request = {**headers, "args": args, "kwargs": kwargs, "hostname": "cpu@local",
                   "is_eager": False, "delivery_info": {
                       "exchange": "", "routing_key": queue, "priority": 0,
                       "redelivered": False},
                   "reply_to": None, "correlation_id": headers["id"], **embed}
        # A worker puts the custom headers on the request (and under "headers").
        request["headers"] = {k: v for k, v in headers.items() if k.startswith("celery_idem")}
        requests.append((headers["id"], args, kwargs, request))

    def loop() -> None:
        for task_id, args, kwargs, request in requests:
            out = tracer(task_id, args, kwargs, request)
            if out.info is not None and isinstance(out.info, BaseException):
                raise out.info
    return loop
