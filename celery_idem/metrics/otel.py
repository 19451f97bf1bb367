"""celery-idem's metrics as OpenTelemetry instruments (``CELERY_IDEM_METRICS = "otel"``).

Only ``opentelemetry-api`` is used: the project installs the SDK and an exporter of its
choice and sets the meter provider (before or after this module makes its instruments:
the API's proxy meter forwards to the provider once it is set). The names are the
Prometheus ones (docs/how-to/metrics.md), so dashboards read either; the gauges are observable
gauges read through the same cache as Prometheus's (``metrics.gauges``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry import metrics

from .definitions import (
    CLAIM_TO_COMMIT,
    COUNTERS,
    GAUGES_UP,
    JOBS,
    LATENCY_BUCKETS,
    OLDEST_NEVER_SENT,
    OLDEST_STALE_CLAIM,
    Metric,
)
from .gauges import Gauges, Reading

SCOPE = "celery_idem"


class OtelSink:
    """The counters and the histogram on ``meter`` (default: the global provider's)."""

    def __init__(self, meter: Any = None, gauges: Gauges | None = None) -> None:
        meter = meter or metrics.get_meter(SCOPE)
        self.counters = {m.name: meter.create_counter(m.name, description=m.help)
                         for m in COUNTERS}
        self.histogram = meter.create_histogram(
            CLAIM_TO_COMMIT.name, unit="s", description=CLAIM_TO_COMMIT.help,
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS)
        self.gauges = gauges or Gauges()
        for metric, observe in ((JOBS, _jobs), (OLDEST_STALE_CLAIM, _stale),
                                (OLDEST_NEVER_SENT, _unsent), (GAUGES_UP, _up)):
            meter.create_observable_gauge(metric.name, callbacks=[self._callback(observe)],
                                          description=metric.help,
                                          unit="s" if metric.name.endswith("_seconds") else "")

    def add(self, metric: Metric, labels: dict[str, str]) -> None:
        self.counters[metric.name].add(1, labels)

    def observe(self, metric: Metric, labels: dict[str, str], value: float) -> None:
        self.histogram.record(value, labels)

    def _callback(self, observe: Any) -> Any:
        def callback(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
            return observe(self.gauges.read())
        return callback


def _jobs(reading: Reading) -> list[metrics.Observation]:
    return [metrics.Observation(n, {"task": task, "state": state})
            for (task, state), n in sorted(reading.jobs.items())]


def _stale(reading: Reading) -> list[metrics.Observation]:
    return [metrics.Observation(reading.oldest_stale_claim)]


def _unsent(reading: Reading) -> list[metrics.Observation]:
    return [metrics.Observation(reading.oldest_never_sent)]


def _up(reading: Reading) -> list[metrics.Observation]:
    return [metrics.Observation(1 if reading.up else 0)]
