"""Integration tests: real worker processes on the broker this run is configured with."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
from django.conf import settings

from tests.conftest import require_service

from .workers import Worker

BROKER_SERVICES = {"redis": "redis", "amqp": "rabbitmq", "pyamqp": "rabbitmq"}


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
def worker(broker_service, transactional_db):
    """A prefork worker (2 processes) for one test, stopped afterwards."""
    w = Worker(concurrency=2).start()
    yield w
    w.stop()
