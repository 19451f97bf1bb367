"""Metrics without services: which transition counts where, in a real prometheus_client
registry and a real OpenTelemetry SDK reader; the label limit; the checks; the dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from celery import shared_task
from django.core.checks import Error
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from celery_idem import checks_settings, metrics
from celery_idem.idempotent_task import IdempotentTask
from celery_idem.metrics import checks as metrics_checks
from celery_idem.metrics import definitions, prometheus, tracing
from celery_idem.metrics.gauges import Gauges, Reading
from celery_idem.metrics.otel import OtelSink
from celery_idem.metrics.prometheus import JobGauges, PrometheusSink
from celery_idem.metrics.recorder import OTHER, UNKNOWN, Recorder
from celery_idem.states import MOVES
from celery_idem.testing import InMemoryBackend, use_backend


@shared_task(base=IdempotentTask, bind=True, idempotency_key="traced/{n}", name="tests.traced")
def traced(self, n):
    return n


DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "grafana-dashboard.json"
TASK = "shop.ship"


@pytest.fixture
def registry():
    return CollectorRegistry()


@pytest.fixture
def recorder(registry):
    return Recorder([PrometheusSink(registry)], max_tasks=50)


def send(recorder, event, from_state="RUNNING", *, job=1, attempt=1, task=TASK, clock=0.0):
    recorder.on_transition(event=event, from_state=from_state, job_id=job, attempt=attempt,
                           task_name=task, clock=clock)


def value(registry, name, **labels):
    return registry.get_sample_value(name, labels) or 0.0


def test_every_announced_move_is_counted_or_left_out_on_purpose():
    """A new move must be given a metric or be named as not counted: nothing drifts."""
    counted = {event for event, _ in definitions.COUNTED}
    announced = {m.event for m in MOVES.values() if m.announced}
    assert announced == counted | definitions.NOT_COUNTED
    assert not counted & definitions.NOT_COUNTED


def test_a_claim_and_its_commit_count_once_each_and_time_the_body(registry, recorder):
    send(recorder, "claimed", "PENDING", clock=10.0)
    send(recorder, "succeeded", clock=12.5)
    assert value(registry, "celery_idem_claims_total", task=TASK, kind="claimed") == 1
    assert value(registry, "celery_idem_commits_total", task=TASK, outcome="succeeded") == 1
    latency = dict(task=TASK, outcome="succeeded")
    assert value(registry, "celery_idem_claim_to_commit_seconds_count", **latency) == 1
    assert value(registry, "celery_idem_claim_to_commit_seconds_sum", **latency) == 2.5
    # A commit whose claim this process never saw (another worker's) is counted, not timed.
    send(recorder, "failed", job=2, clock=20.0)
    assert value(registry, "celery_idem_commits_total", task=TASK, outcome="failed") == 1
    assert value(registry, "celery_idem_claim_to_commit_seconds_count", task=TASK,
                 outcome="failed") == 0


def test_duplicates_count_as_replayed_or_waited(registry, recorder):
    send(recorder, "duplicate", "SUCCEEDED")
    recorder.on_waiting(task_name=TASK, job_id=1, attempt=1)
    recorder.on_waiting(task_name=TASK, job_id=1, attempt=1)
    assert value(registry, "celery_idem_duplicates_total", task=TASK, outcome="replayed") == 1
    assert value(registry, "celery_idem_duplicates_total", task=TASK, outcome="waited") == 2
    assert value(registry, "celery_idem_claims_total", task=TASK, kind="claimed") == 0


@pytest.mark.parametrize(("event", "from_state", "expected"), [
    ("taken_over", "RUNNING", [("celery_idem_claims_total", {"kind": "taken_over"}),
                               ("celery_idem_recoveries_total", {"kind": "taken_over"})]),
    ("released", "RUNNING", [("celery_idem_recoveries_total", {"kind": "released"})]),
    ("redispatched", "PENDING", [("celery_idem_recoveries_total", {"kind": "redispatched"})]),
    ("dead_lettered", "RUNNING", [("celery_idem_dead_letters_total",
                                   {"reason": "max_attempts"})]),
    ("dead_lettered", "PENDING", [("celery_idem_dead_letters_total",
                                   {"reason": "undeliverable"}),
                                  ("celery_idem_recoveries_total", {"kind": "undeliverable"})]),
    ("uncertain", "RUNNING", [("celery_idem_uncertain_total", {})]),
    ("expired", "PENDING", [("celery_idem_expired_total", {})]),
    ("late_finish", "SUCCEEDED", [("celery_idem_late_finishes_total", {})]),
    ("retry_scheduled", "RUNNING", [("celery_idem_retries_total", {})]),
    ("published", None, [("celery_idem_intents_total", {})]),
])
def test_recoveries_dead_letters_and_the_rest_count_by_kind(registry, recorder, event,
                                                            from_state, expected):
    send(recorder, event, from_state)
    counted = {(s.name, tuple(sorted(s.labels.items())))
               for family in registry.collect() for s in family.samples
               if s.name.endswith("_total") and s.value}
    assert counted == {(name, tuple(sorted({"task": TASK, **labels}.items())))
                       for name, labels in expected}


def test_operator_moves_count_nothing(registry, recorder):
    for event in definitions.NOT_COUNTED:
        send(recorder, event, "FAILED")
    assert not [s for family in registry.collect() for s in family.samples if s.value]


def test_task_labels_are_bounded(registry):
    recorder = Recorder([PrometheusSink(registry)], max_tasks=2)
    for task in ["a", "b", "c", "d", "a", ""]:
        send(recorder, "claimed", "PENDING", task=task)
    claims = {s.labels["task"]: s.value for family in registry.collect()
              for s in family.samples if s.name == "celery_idem_claims_total"}
    assert claims == {"a": 2, "b": 1, OTHER: 2, UNKNOWN: 1}


def reading(alias, now, max_tasks):
    return Reading({(TASK, "SUCCEEDED"): 7, (TASK, "PENDING"): 1}, 30.0, 4.0, up=True)


def test_the_gauges_collector_renders_a_cached_reading(registry):
    calls = []

    def counted_reading(*args):
        calls.append(args)
        return reading(*args)

    registry.register(JobGauges(Gauges(ttl=3600, reader=counted_reading)))
    assert calls == [], "registering the collector reads nothing"
    assert value(registry, "celery_idem_jobs", task=TASK, state="SUCCEEDED") == 7
    assert value(registry, "celery_idem_oldest_stale_claim_age_seconds") == 30
    assert value(registry, "celery_idem_oldest_never_sent_intent_age_seconds") == 4
    assert value(registry, "celery_idem_gauges_up") == 1
    assert len(calls) == 1, "the second scrape within the TTL used the cached reading"


def test_the_same_counters_and_gauges_as_opentelemetry_metrics():
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    recorder = Recorder([OtelSink(meter, Gauges(ttl=3600, reader=reading))], max_tasks=50)
    send(recorder, "claimed", "PENDING", clock=1.0)
    send(recorder, "succeeded", clock=1.5)
    points = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = (metric.name, tuple(sorted(point.attributes.items())))
                    points[key] = getattr(point, "value", None) or getattr(point, "sum", None)
    assert points[("celery_idem_claims", (("kind", "claimed"), ("task", TASK)))] == 1
    assert points[("celery_idem_commits", (("outcome", "succeeded"), ("task", TASK)))] == 1
    assert points[("celery_idem_claim_to_commit_seconds",
                   (("outcome", "succeeded"), ("task", TASK)))] == 0.5
    assert points[("celery_idem_jobs", (("state", "SUCCEEDED"), ("task", TASK)))] == 7
    assert points[("celery_idem_oldest_stale_claim_age_seconds", ())] == 30


def test_metrics_are_off_unless_a_backend_is_named(settings):
    settings.CELERY_IDEM_METRICS = None
    assert metrics.enabled() == []
    settings.CELERY_IDEM_METRICS = ["prometheus", "otel"]
    assert metrics.enabled() == ["prometheus", "otel"]


def test_a_backend_whose_library_is_missing_is_an_error_naming_the_extra(settings,
                                                                         monkeypatch):
    settings.CELERY_IDEM_METRICS = "prometheus"
    monkeypatch.setitem(metrics.BACKENDS, "prometheus",
                        ("prometheus_client_not_installed", "pip install celery-idem[metrics]"))
    [error] = metrics_checks.check_metrics()
    assert isinstance(error, Error) and error.id == "celery_idem.E021"
    assert "pip install celery-idem[metrics]" in error.hint


def test_an_unknown_backend_and_a_port_without_prometheus_are_reported(settings):
    settings.CELERY_IDEM_METRICS = "statsd"
    settings.CELERY_IDEM_METRICS_PORT = 9808
    assert [m.id for m in checks_settings.check_settings()] == ["celery_idem.E020"]
    settings.CELERY_IDEM_METRICS = None
    assert [m.id for m in metrics_checks.check_metrics()] == ["celery_idem.W020"]
    settings.CELERY_IDEM_METRICS = "prometheus"
    assert metrics_checks.check_metrics() == []


def test_a_prefork_worker_exporting_without_multiprocess_mode_is_refused(settings, caplog,
                                                                        monkeypatch):
    """Its exporter would show the main process's counters only: none starts, and an
    error names the fix."""
    class PreforkWorker:
        pool_cls = "prefork"

    settings.CELERY_IDEM_METRICS_PORT = 9808
    monkeypatch.delenv(prometheus.MULTIPROC_ENV, raising=False)
    monkeypatch.setattr(prometheus, "start_http_server",
                        lambda port, addr: pytest.fail("an exporter was started"))
    prometheus.check_worker(PreforkWorker())
    prometheus.serve_worker()
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert prometheus.MULTIPROC_ENV in caplog.records[0].getMessage()

    started = []
    monkeypatch.setattr(prometheus, "start_http_server", lambda *args: started.append(args))
    monkeypatch.setenv(prometheus.MULTIPROC_ENV, "/tmp")
    prometheus.check_worker(PreforkWorker())
    prometheus.serve_worker()
    assert started == [(9808, "0.0.0.0")]


def test_the_dashboard_queries_only_metrics_the_library_defines():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    # Every name anywhere in it: the panels' queries and the task variable's.
    queried = set(re.findall(r"celery_idem_\w+", json.dumps(dashboard)))
    assert len(exprs) >= 8 and queried
    defined = set().union(*(m.series() for m in definitions.METRICS.values()))
    assert queried - defined == set()
    # And it shows what an operator watches first.
    assert {"celery_idem_claims_total", "celery_idem_commits_total",
            "celery_idem_duplicates_total", "celery_idem_jobs"} <= queried


def test_a_failed_reading_keeps_the_last_values_and_reports_the_gauges_down():
    from django.db import DatabaseError

    readings = [reading("default", None, 0)]

    def flaky(*args):
        if readings:
            return readings.pop()
        raise DatabaseError("the database is down")

    gauges = Gauges(ttl=0, reader=flaky)
    assert gauges.read().up
    down = gauges.read()
    assert not down.up and down.jobs == {(TASK, "SUCCEEDED"): 7, (TASK, "PENDING"): 1}


@pytest.fixture
def spans():
    """Spans finished while the test runs, in OpenTelemetry's in-memory exporter."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider.get_tracer("test"))
    yield exporter
    tracing.disable()


def test_a_claim_and_its_commit_are_spans_when_tracing_is_on(spans):
    with use_backend(InMemoryBackend()):
        assert traced.apply(args=(1,)).get() == 1
        assert traced.apply(args=(1,)).get() == 1  # a replay: a claim that did not win
    assert [(s.name, dict(s.attributes)) for s in spans.get_finished_spans()] == [
        ("celery_idem.claim", {"celery_idem.task": "tests.traced"}),
        ("celery_idem.commit", {"celery_idem.task": "tests.traced",
                                "celery_idem.event": "succeeded"}),
        ("celery_idem.claim", {"celery_idem.task": "tests.traced"}),
    ]


def test_off_a_claim_makes_no_span():
    assert tracing.span("celery_idem.claim", TASK) is tracing.span("celery_idem.commit", TASK)


def test_an_exporter_port_already_taken_is_an_error_not_a_crash(settings, caplog):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings.CELERY_IDEM_METRICS_PORT = taken.getsockname()[1]
        settings.CELERY_IDEM_METRICS_ADDRESS = "127.0.0.1"
        prometheus.serve_worker()
    [record] = caplog.records
    assert record.levelname == "ERROR" and "CELERY_IDEM_METRICS_PORT" in record.getMessage()
