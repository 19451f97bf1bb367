"""celery-idem's metrics for Prometheus (``pip install celery-idem[metrics]``).

The counters and the histogram are ``prometheus_client`` metrics, incremented by the
recorder in whichever process makes the transition. The gauges come from a collector
(``JobGauges``) that reads the database when scraped, through the cache of
``metrics.gauges``.

Prefork workers run tasks in child processes, whose counters live in those children.
With ``PROMETHEUS_MULTIPROC_DIR`` set (before the worker starts, to an empty folder),
``prometheus_client``'s multiprocess mode has every process write its values to files
there, and the exporter sums them: the exporter the worker's main process starts
(``CELERY_IDEM_METRICS_PORT``) serves the whole pool, children replaced or not.
docs/how-to/metrics.md says why this and not an exporter per child.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client import start_http_server as _serve
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from ..conf import settings
from .definitions import CLAIM_TO_COMMIT as LATENCY
from .definitions import (
    COUNTERS,
    GAUGES_UP,
    JOBS,
    LATENCY_BUCKETS,
    OLDEST_NEVER_SENT,
    OLDEST_STALE_CLAIM,
    Metric,
)
from .gauges import Gauges

logger = logging.getLogger(__name__)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class PrometheusSink:
    """The counters and the histogram, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.counters = {m.name: Counter(m.name, m.help, m.labels, registry=registry)
                         for m in COUNTERS}
        self.histogram = Histogram(LATENCY.name, LATENCY.help, LATENCY.labels,
                                   buckets=LATENCY_BUCKETS, registry=registry)

    def add(self, metric: Metric, labels: dict[str, str]) -> None:
        self.counters[metric.name].labels(**labels).inc()

    def observe(self, metric: Metric, labels: dict[str, str], value: float) -> None:
        self.histogram.labels(**labels).observe(value)


class JobGauges(Collector):
    """The gauges, read from the database when scraped (cached: ``metrics.gauges``)."""

    def __init__(self, gauges: Gauges | None = None) -> None:
        self.gauges = gauges or Gauges()

    def describe(self) -> list[Any]:
        # Named without reading: registering a collector must not query the database.
        return list(self._families())

    def collect(self) -> Iterator[Any]:
        reading = self.gauges.read()
        jobs, stale, unsent, up = self._families()
        for (task, state), count in sorted(reading.jobs.items()):
            jobs.add_metric([task, state], count)
        stale.add_metric([], reading.oldest_stale_claim)
        unsent.add_metric([], reading.oldest_never_sent)
        up.add_metric([], 1.0 if reading.up else 0.0)
        yield from (jobs, stale, unsent, up)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (GaugeMetricFamily(JOBS.name, JOBS.help, labels=JOBS.labels),
                *(GaugeMetricFamily(m.name, m.help, labels=())
                  for m in (OLDEST_STALE_CLAIM, OLDEST_NEVER_SENT, GAUGES_UP)))


_served: CollectorRegistry | None = None
#: Whether check_worker refused to export this worker's metrics, and why.
_refused = False
REFUSED = (
    f"celery-idem metrics: CELERY_IDEM_METRICS_PORT is set on a prefork worker without "
    f"{MULTIPROC_ENV}: the counters of its pool's children would not be exported, so no "
    f"exporter is started. Set {MULTIPROC_ENV} to an empty folder before the worker "
    "starts (docs/how-to/metrics.md, Prefork workers)")


def registry() -> CollectorRegistry:
    """What an exporter serves: every process's counters (multiprocess mode) or this
    process's, and the gauges. For a project that serves metrics itself (a Django view
    with ``prometheus_client.make_wsgi_app(registry())``, django-prometheus)."""
    global _served
    if _served is None:
        if os.environ.get(MULTIPROC_ENV):
            served = CollectorRegistry()
            MultiProcessCollector(served)
        else:
            served = REGISTRY
        served.register(JobGauges())
        _served = served
    return _served


def start_http_server(port: int, addr: str = "0.0.0.0") -> Any:
    """Serve ``registry()`` over HTTP on ``port`` from a thread of this process; returns
    the server (``shutdown()`` stops it). Started for you in a worker's main process when
    ``CELERY_IDEM_METRICS_PORT`` is set."""
    server, _ = _serve(port, addr, registry=registry())
    logger.info("celery-idem metrics on http://%s:%s/metrics", addr, port)
    return server


def check_worker(sender: Any = None, **_: Any) -> None:
    """``worker_init`` (the worker's main process): a prefork worker exporting its
    metrics needs multiprocess mode, or the children's counters are never seen; then no
    exporter starts, and an error says why. Logged, not raised: Celery's logging is not
    set up yet and it would swallow the exception; the tasks still run."""
    global _refused
    from ..pools import is_prefork

    _refused = bool(settings.METRICS_PORT and is_prefork(sender)
                    and not os.environ.get(MULTIPROC_ENV))
    if _refused:
        logger.error(REFUSED)


def serve_worker(sender: Any = None, **_: Any) -> None:
    """``worker_ready`` (the worker's main process, after the pool has started)."""
    port, addr = settings.METRICS_PORT, str(settings.METRICS_ADDRESS)
    if not port or _refused:
        return
    try:
        start_http_server(int(port), addr)
    except OSError as exc:  # the port is taken (another worker on this host?)
        logger.error("celery-idem metrics: no exporter on %s:%s: %s (give each worker "
                     "on a host its own CELERY_IDEM_METRICS_PORT)", addr, port, exc)


def child_exited(sender: Any = None, pid: int | None = None, **_: Any) -> None:
    """``worker_process_shutdown`` (a pool child): its live-gauge files are let go. Its
    counters stay in the folder and keep counting in the sums, as a counter must."""
    if os.environ.get(MULTIPROC_ENV):
        mark_process_dead(pid or os.getpid())
