"""Spans around a claim and a commit, on OpenTelemetry's API, when ``CELERY_IDEM_METRICS``
enables "otel" (``metrics.install`` calls ``enable``). Off, ``span`` returns one shared
no-op context: a claim or a commit pays a function call, and nothing is imported."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

SCOPE = "celery_idem"
_OFF: AbstractContextManager[Any] = nullcontext()
_tracer: Any = None


def span(name: str, task: str, **attributes: str) -> AbstractContextManager[Any]:
    """A span ``name`` (in the current trace: the task's, where the project traces Celery)
    labelled with the job's task and ``attributes``; a no-op while tracing is off."""
    if _tracer is None:
        return _OFF
    return _tracer.start_as_current_span(name, attributes={
        "celery_idem.task": task, **{f"celery_idem.{k}": v for k, v in attributes.items()}})


def enable(tracer: Any = None) -> None:
    """Trace on ``tracer`` (default: the global provider's), or stop with ``disable``."""
    global _tracer
    if tracer is None:
        from opentelemetry import trace

        tracer = trace.get_tracer(SCOPE)
    _tracer = tracer


def disable() -> None:
    global _tracer
    _tracer = None
