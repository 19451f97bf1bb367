"""Integration tests: real worker processes on the broker this run is configured with."""

from __future__ import annotations

import importlib.util
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
    if "pool" not in metafunc.fixturenames:
        return
    marked = metafunc.definition.get_closest_marker("pools") is not None
    pools = tier_pools() if marked or FULL_MATRIX else ("prefork",)
    metafunc.parametrize("pool", [pytest.param(p, marks=_pool_marks(p)) for p in pools])


def _pool_marks(pool: str) -> list[pytest.MarkDecorator]:
    if pool != "gevent":
        return []
    if importlib.util.find_spec("gevent") is None:
        return [pytest.mark.skip(reason="gevent is not installed (test extras)")]
    if settings.DATABASE_KIND == "sqlite":
        # sqlite3 waits for a lock in C, blocking the event loop, so the greenlet that
        # holds the lock cannot finish (docs/operations.md, Worker pools).
        return [pytest.mark.skip(reason="SQLite's lock wait blocks gevent's event loop")]
    if settings.DATABASE_KIND == "mysql" and os.environ.get("IDEM_MYSQL_DRIVER") != "pymysql":
        # mysqlclient waits for a row lock in C: check celery_idem.E005.
        return [pytest.mark.skip(reason="mysqlclient's lock wait blocks gevent's event loop")]
    return []


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
