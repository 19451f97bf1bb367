"""A real prefork worker with metrics on (CELERY_IDEM_METRICS = "prometheus", its
exporter on a free port, PROMETHEUS_MULTIPROC_DIR for the pool's children), scraped over
HTTP and parsed with prometheus_client's text parser: the counters say what happened."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_app.effects.tasks import deduct_stock, ship_order

from .workers import Worker, purge_queue, wait_until, worker_env

RESULT_TIMEOUT = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """Every sample the exporter serves: (name, labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples, name, **labels) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture
def metrics_worker(broker_service, transactional_db, tmp_path):
    """A prefork worker (two children) exporting its metrics on a free port."""
    purge_queue()
    port = free_port()
    (tmp_path / "multiproc").mkdir()
    env = worker_env(CELERY_IDEM_METRICS=json.dumps("prometheus"),
                     CELERY_IDEM_METRICS_PORT=json.dumps(port),
                     CELERY_IDEM_METRICS_CACHE_SECONDS=json.dumps(0),
                     PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "multiproc"))
    worker = Worker(pool="prefork", env=env).start()
    yield worker, port
    worker.stop()
    worker.assert_no_persistence_errors()


def test_a_scrape_of_a_prefork_worker_counts_claims_commits_and_duplicates(metrics_worker):
    """Two keys run, one published again (replayed), one atomic body held 0.2 s: the
    pool's children's counters reach the main process's exporter; the gauges are there."""
    worker, port = metrics_worker
    ship, deduct = ship_order.name, deduct_stock.name
    assert ship_order.delay(9001).get(timeout=RESULT_TIMEOUT)["shipped"] == 9001
    assert ship_order.delay(9002).get(timeout=RESULT_TIMEOUT)["shipped"] == 9002
    assert ship_order.delay(9001).get(timeout=RESULT_TIMEOUT)["shipped"] == 9001  # replayed
    deduct_stock.delay(9003, 1, 1, hold=0.2).get(timeout=RESULT_TIMEOUT)

    expected = {
        ("celery_idem_claims_total", (("task", ship), ("kind", "claimed"))): 2,
        ("celery_idem_commits_total", (("task", ship), ("outcome", "succeeded"))): 2,
        ("celery_idem_duplicates_total", (("task", ship), ("outcome", "replayed"))): 1,
        ("celery_idem_claims_total", (("task", deduct), ("kind", "claimed"))): 1,
        ("celery_idem_commits_total", (("task", deduct), ("outcome", "succeeded"))): 1,
        ("celery_idem_claim_to_commit_seconds_count",
         (("task", ship), ("outcome", "succeeded"))): 2,
    }

    def counted():
        samples = scrape(port)
        seen = {key: sample(samples, key[0], **dict(key[1])) for key in expected}
        return samples if seen == expected else None

    samples = wait_until(counted, timeout=30, what=f"the scraped counters to be {expected}")
    assert sample(samples, "celery_idem_duplicates_total", task=ship, outcome="waited") is None
    # The atomic body's claim is announced at its commit, but timed from when it was made.
    assert sample(samples, "celery_idem_claim_to_commit_seconds_sum", task=deduct,
                  outcome="succeeded") >= 0.2
    # The gauges, read from the database by the exporter.
    assert sample(samples, "celery_idem_jobs", task=ship, state="SUCCEEDED") == 2
    assert sample(samples, "celery_idem_jobs", task=deduct, state="SUCCEEDED") == 1
    assert sample(samples, "celery_idem_oldest_stale_claim_age_seconds") == 0
    assert sample(samples, "celery_idem_oldest_never_sent_intent_age_seconds") == 0
    assert sample(samples, "celery_idem_gauges_up") == 1
    assert len(worker.children()) == 2, "the tasks ran in the pool's children"
    assert "Signal handler" not in worker.log(), "a metrics receiver raised"
