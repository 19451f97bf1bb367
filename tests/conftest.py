"""Shared test helpers: service checks that fail in CI and skip elsewhere."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from django_app.fakes.provider import RunningProvider

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

SERVICES = {
    "postgres": ("127.0.0.1", 5432),
    "redis": ("127.0.0.1", 6379),
    "rabbitmq": ("127.0.0.1", 5672),
    "mariadb": ("127.0.0.1", 3306),
}


def require_service(name: str) -> None:
    """Skip the test when ``name`` is not listening; in CI, fail instead."""
    host, port = SERVICES[name]
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as exc:
        message = f"{name} is not reachable on {host}:{port}: {exc}"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def pytest_sessionstart(session: pytest.Session) -> None:
    from django.conf import settings

    service = {"postgres": "postgres", "mysql": "mariadb"}.get(settings.DATABASE_KIND)
    if service is not None:
        host, port = SERVICES[service]
        try:
            socket.create_connection((host, port), timeout=2).close()
        except OSError as exc:
            if IN_CI:
                pytest.exit(f"{service} is required in CI and not reachable: {exc}", 1)
            pytest.exit(f"IDEM_DATABASE={settings.DATABASE_KIND} but {service} is not "
                        f"reachable on {host}:{port}: {exc}", 1)


@pytest.fixture
def fake_provider() -> Iterator[RunningProvider]:
    """The fake payment provider (django_app/fakes/provider.py) on a free port of
    127.0.0.1, fresh for each test; ``.url`` for workers, ``.provider`` to inspect it."""
    from django_app.fakes.provider import serve

    with serve() as running:
        yield running


@pytest.fixture(autouse=True)
def _close_bookkeeping_connections() -> Iterator[None]:
    """The producer writes an intent outside a transaction on this process's bookkeeping
    connection (celery_idem.connection), which outlives the test: close it after each
    test that opened one, so the test database can be dropped at the end."""
    yield
    from celery_idem import connection

    if connection.open_count():
        connection.close_bookkeeping_connections()


PGBOUNCER = os.environ.get("IDEM_PGBOUNCER") == "1"

if PGBOUNCER:
    # Behind PgBouncer (the pgbouncer tier: tests/services/pgbouncer.py) the test database
    # is created and dropped on the server itself, and used through the pooler in between:
    # DROP DATABASE fails while the pooler keeps server sessions open on it.

    def _point_at(port: str) -> None:
        from django.db import connections

        for conn in connections.all():
            conn.close()
            conn.settings_dict["PORT"] = port

    @pytest.fixture(scope="session")
    def django_db_modify_db_settings(django_db_modify_db_settings):  # noqa: F811
        from django.conf import settings

        _point_at(settings.PG_DIRECT_PORT)

    @pytest.fixture(scope="session")
    def django_db_setup(django_db_setup, django_db_blocker):  # noqa: F811
        from django.conf import settings
        from django.db import connection

        from tests.services.pgbouncer import admin

        pooler = os.environ["IDEM_PG_PORT"]
        _point_at(pooler)
        yield
        with django_db_blocker.unblock():
            _point_at(settings.PG_DIRECT_PORT)
            # Close the pooler's server sessions on the test database (KILL pauses it).
            name = str(connection.settings_dict["NAME"])
            admin(int(pooler), f"KILL {name}")
            admin(int(pooler), f"RESUME {name}")


@pytest.fixture
def sent(monkeypatch):
    """The headers of every message that leaves (kombu's publish, on any producer)."""
    from kombu import Producer

    headers: list[dict] = []
    real = Producer.publish

    def publish(self, body, *args, **kwargs):
        headers.append(dict(kwargs.get("headers") or {}))
        return real(self, body, *args, **kwargs)

    monkeypatch.setattr(Producer, "publish", publish)
    return headers
