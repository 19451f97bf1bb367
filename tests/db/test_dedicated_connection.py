"""The worker's own bookkeeping connection: it outlives Celery's per-task reconnect."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connections

from celery_idem import claims
from celery_idem.backends import get_backend
from celery_idem.backends.generic import GenericBackend
from celery_idem.connection import bookkeeping_connection, close_bookkeeping_connections
from celery_idem.models import Job
from celery_idem.producer import write_intent
from django_app.effects.tasks import ship_order

pytestmark = pytest.mark.django_db(transaction=True)
on_postgres = settings.DATABASE_KIND == "postgres"


@pytest.fixture(autouse=True)
def _closed_after():
    yield
    close_bookkeeping_connections()  # the test database is dropped at the end


def claim(n):
    intent = ship_order.intent((n,))
    write_intent(intent, f"pub-{n}")
    return claims.acquire(intent, worker="h/1", task_id=f"t-{n}", lease_seconds=60,
                          using="default", dedicated=True)[1]


def test_dedicated_claims_commit_and_are_seen_by_django_at_once():
    """Claim and commit on the dedicated connection are visible to Django's connection."""
    c = claim(1)
    assert Job.objects.get(key="ship/1").state == "RUNNING"
    assert c.succeed({"ok": 1})
    assert Job.objects.get(key="ship/1").result == {"ok": 1}


@pytest.mark.skipif(on_postgres, reason="SQLite only: PostgreSQL has the connection")
def test_sqlite_bookkeeping_shares_djangos_connection():
    """On SQLite, where connecting is free, the portable backend uses Django's."""
    assert isinstance(get_backend("default", dedicated=True), GenericBackend)
    claim(2).succeed(2)
    assert Job.objects.get(key="ship/2").state == "SUCCEEDED"


@pytest.mark.skipif(not on_postgres, reason="the dedicated connection is PostgreSQL's")
def test_the_dedicated_connection_survives_closing_djangos_connections():
    """What Celery's fixup does before and after every task does not reconnect it."""
    claim(2).succeed(2)
    before = bookkeeping_connection("default").connection
    connections.close_all()
    claim(3).succeed(3)
    assert bookkeeping_connection("default").connection is before
    with bookkeeping_connection("default").cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone()[0] >= 2, "claim and commit are prepared statements"
    assert bookkeeping_connection("default") is not connections["default"]


@pytest.mark.skipif(not on_postgres, reason="the dedicated connection is PostgreSQL's")
def test_dedicated_commits_do_not_wait_for_the_flush_unless_asked(settings):
    """synchronous_commit is off on that connection only, and the setting turns it on."""
    assert _synchronous_commit(bookkeeping_connection("default")) == "off"
    assert _synchronous_commit(connections["default"]) == "on"
    close_bookkeeping_connections()
    settings.CELERY_IDEM_SYNCHRONOUS_COMMIT = True
    assert _synchronous_commit(bookkeeping_connection("default")) == "on"


def _synchronous_commit(wrapper):
    with wrapper.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]
