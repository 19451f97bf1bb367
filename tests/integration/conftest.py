"""Integration tests: real worker processes on the broker this run is configured with."""

from __future__ import annotations

import importlib.util
import json
import os
from urllib.parse import urlparse

import pytest
from django.conf import settings

from tests.conftest import require_service

from .workers import POOL_CONCURRENCY, Worker, purge_queue

BROKER_SERVICES = {"redis": "redis", "amqp": "rabbitmq", "pyamqp": "rabbitmq"}

#: IDEM_FULL_MATRIX=1 runs every worker test on every pool and every tier; without it,
#: the tests marked ``pools`` run on the tier's pools (tier_pools) and the rest on prefork.
FULL_MATRIX = os.environ.get("IDEM_FULL_MATRIX", "") == "1"


def tier_pools() -> tuple[str, ...]:
    """The pools this tier runs the ``pools`` tests on: all four on PostgreSQL + Redis
    (where the bookkeeping connection is per thread), prefork and threads on SQLite."""
    all_pools = tuple(POOL_CONCURRENCY)
    if FULL_MATRIX:
        return all_pools
    if os.environ.get("IDEM_POOLS"):
        # The tier names its own (tests/tiers.py: the oldest and newest stacks).
        return tuple(os.environ["IDEM_POOLS"].split(","))
    broker = urlparse(settings.CELERY_BROKER_URL).scheme
    if settings.PGBOUNCER:
        # Behind the pooler: the pool whose bookkeeping connections are per process, and
        # the one with one per running greenlet (the most clients).
        return ("prefork", "gevent")
    if settings.DATABASE_KIND == "postgres" and broker == "redis":
        return all_pools
    if settings.DATABASE_KIND == "sqlite":
        return ("prefork", "threads")
    return ("prefork",)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    durability = "durability" in metafunc.fixturenames
    if "pool" not in metafunc.fixturenames:
        if durability:
            metafunc.parametrize("durability", [
                "database", pytest.param("broker", marks=_broker_durability_marks())],
                indirect=True)
        return
    marked = metafunc.definition.get_closest_marker("pools") is not None
    pools = tier_pools() if marked or FULL_MATRIX else ("prefork",)
    if not durability:
        metafunc.parametrize("pool", [pytest.param(p, marks=_pool_marks(p)) for p in pools])
        return
    # Broker durability on prefork only (every pool with IDEM_FULL_MATRIX=1): what it
    # changes is the claim's statement, not how a pool runs it.
    combos = [pytest.param(p, "database", marks=_pool_marks(p), id=p) for p in pools]
    combos += [pytest.param(p, "broker", marks=[*_pool_marks(p), *_broker_durability_marks()],
                            id=f"{p}-broker")
               for p in (pools if FULL_MATRIX else ("prefork",))]
    metafunc.parametrize(("pool", "durability"), combos, indirect=["durability"])


def _pool_marks(pool: str) -> list[pytest.MarkDecorator]:
    if pool != "gevent":
        return []
    if importlib.util.find_spec("gevent") is None:
        return [pytest.mark.skip(reason="gevent is not installed (test extras)")]
    if settings.DATABASE_KIND == "sqlite":
        # sqlite3 waits for a lock in C, blocking the event loop, so the greenlet that
        # holds the lock cannot finish (docs/how-to/worker-pools.md).
        return [pytest.mark.skip(reason="SQLite's lock wait blocks gevent's event loop")]
    if settings.DATABASE_KIND == "mysql" and os.environ.get("IDEM_MYSQL_DRIVER") != "pymysql":
        # mysqlclient waits for a row lock in C: check celery_idem.E005.
        return [pytest.mark.skip(reason="mysqlclient's lock wait blocks gevent's event loop")]
    return []


def _broker_durability_marks() -> list[pytest.MarkDecorator]:
    """The failure-window tests with CELERY_IDEM_DURABILITY = "broker": ``delivery``, so
    the PostgreSQL + RabbitMQ tier runs them, and only on the PostgreSQL + Redis/RabbitMQ
    tiers (CI's cost; IDEM_FULL_MATRIX=1 runs them everywhere)."""
    broker = urlparse(settings.CELERY_BROKER_URL).scheme
    marks = [pytest.mark.delivery]
    if not FULL_MATRIX and (settings.DATABASE_KIND != "postgres" or settings.PGBOUNCER
                            or broker not in BROKER_SERVICES):
        marks.append(pytest.mark.skip(reason="broker durability's variants run on the "
                                             "PostgreSQL + Redis/RabbitMQ tiers (--full: all)"))
    return marks


@pytest.fixture
def durability(request, monkeypatch, settings) -> str:
    """CELERY_IDEM_DURABILITY for this test (parametrized: "database", "broker"): in this
    process and in the workers it starts afterwards (``worker_env`` copies the
    environment). Request it before the worker fixtures. A test marked ``needs_intent``
    is skipped in broker mode, before its workers start."""
    mode = request.param
    if mode == "broker" and request.node.get_closest_marker("needs_intent"):
        pytest.skip("needs an intent, which CELERY_IDEM_DURABILITY = 'broker' does not "
                    "write (docs/explanation/reliability.md, the guarantee table)")
    settings.CELERY_IDEM_DURABILITY = mode
    monkeypatch.setenv("CELERY_IDEM_DURABILITY", json.dumps(mode))
    return str(mode)


def broker_redelivers_at_once() -> bool:
    """Whether the broker gives an unacknowledged message back as soon as its consumer's
    connection dies (RabbitMQ); Redis waits for its visibility timeout (an hour)."""
    return urlparse(settings.CELERY_BROKER_URL).scheme in ("amqp", "pyamqp")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.worker)


@pytest.fixture(scope="session")
def broker_service() -> str:
    """The broker this run publishes to; its server must be up (fails in CI if not)."""
    scheme = urlparse(settings.CELERY_BROKER_URL).scheme
    service = BROKER_SERVICES.get(scheme)
    if service:
        require_service(service)
    results = urlparse(settings.CELERY_RESULT_BACKEND).scheme
    if results in BROKER_SERVICES:
        require_service(BROKER_SERVICES[results])
    return service or scheme


@pytest.fixture
def worker(broker_service, transactional_db, pool):
    """A worker on ``pool`` (prefork unless the test is marked ``pools``), stopped after."""
    purge_queue()
    w = Worker(pool=pool).start()
    yield w
    w.stop()
    w.assert_no_persistence_errors()
