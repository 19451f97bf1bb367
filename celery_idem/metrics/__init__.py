"""Metrics for Prometheus and OpenTelemetry (docs/how-to/metrics.md), off unless
``CELERY_IDEM_METRICS`` names a backend.

``install()`` (called by the app config once Django is ready) connects the recorder to
the transition signals, with a sink per backend; nothing here imports a metrics library
unless that backend is enabled and installed (``metrics.checks`` reports one that is not).
"""

from __future__ import annotations

import importlib.util
import logging

from ..conf import settings
from ..errors import ConfigurationError
from ..signals import duplicate_waiting, transition
from .recorder import Recorder, Sink

#: Each backend, the module it needs, and how to install it.
logger = logging.getLogger(__name__)

BACKENDS = {
    "prometheus": ("prometheus_client", "pip install celery-idem[metrics]"),
    "otel": ("opentelemetry.metrics", "pip install opentelemetry-api (with the "
                                      "OpenTelemetry SDK and an exporter of your choice)"),
}
_UID = "celery_idem.metrics"
_recorder: Recorder | None = None


def enabled() -> list[str]:
    """The backends ``CELERY_IDEM_METRICS`` names: a name, a list of names, or None."""
    value = settings.METRICS
    if not value:
        return []
    return [value] if isinstance(value, str) else [str(name) for name in value]


def available(backend: str) -> bool:
    """Whether the library ``backend`` needs is installed."""
    module = BACKENDS[backend][0]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def install() -> Recorder | None:
    """Connect the recorder for the enabled backends that are installed; once per process."""
    global _recorder
    try:
        backends = [b for b in enabled() if available(b)]
    except ConfigurationError as exc:  # check E020 says so too; Django still starts
        logger.error("metrics off: %s", exc, extra={"action": "metrics_misconfigured"})
        return None
    if _recorder is not None or not backends:
        return _recorder
    sinks: list[Sink] = []
    if "prometheus" in backends:
        from celery import signals as celery_signals

        from . import prometheus

        sinks.append(prometheus.PrometheusSink())
        # The exporter of a worker: checked before the pool starts, served from its main
        # process once the pool is up; a pool child's files let go when it exits.
        for signal, receiver in ((celery_signals.worker_init, prometheus.check_worker),
                                 (celery_signals.worker_ready, prometheus.serve_worker),
                                 (celery_signals.worker_process_shutdown,
                                  prometheus.child_exited)):
            signal.connect(receiver, weak=False, dispatch_uid=f"{_UID}.{receiver.__name__}")
    if "otel" in backends:
        from . import tracing
        from .otel import OtelSink

        sinks.append(OtelSink())
        tracing.enable()
    _recorder = Recorder(sinks, int(settings.METRICS_MAX_TASKS))
    transition.connect(_recorder.on_transition, weak=False, dispatch_uid=_UID)
    duplicate_waiting.connect(_recorder.on_waiting, weak=False, dispatch_uid=_UID)
    return _recorder
