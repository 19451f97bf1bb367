"""The pgbouncer tier really runs behind a transaction pooler whose server sessions its
clients share: the test process and the workers connect through it, and the database
sees no more sessions than the pooler's pool (tests/services/pgbouncer.py)."""

from __future__ import annotations

import os

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from django_app.effects.tasks import deduct_stock, ship_order
from tests.services.pgbouncer import admin

pytestmark = pytest.mark.skipif(not settings.PGBOUNCER,
                                reason="the pgbouncer tier's (IDEM_PGBOUNCER=1)")

RESULT_TIMEOUT = 120


def show(what: str) -> list[dict]:
    return admin(int(os.environ["IDEM_PG_PORT"]), f"SHOW {what}")


def test_workers_go_through_the_pooler_and_share_its_sessions(worker):
    """Plain and atomic tasks run on a prefork worker through the pooler, in transaction
    mode: the worker's pool children are its clients, the server sees no more sessions on
    the test database than the pool holds, and clients beyond the pool run on sessions
    that other clients use too."""
    results = [ship_order.delay(n) for n in range(900, 906)]
    results += [deduct_stock.delay(900, n, 1) for n in range(3)]
    assert all(r.get(timeout=RESULT_TIMEOUT) for r in results)

    name = connection.settings_dict["NAME"]
    config = {row["key"]: row["value"] for row in show("CONFIG")}
    assert config["pool_mode"] == "transaction"
    pool_size = next(d["pool_size"] for d in show("DATABASES") if d["name"] == name)
    # This process's two connections (Django's, the bookkeeping one) and a pool child's
    # bookkeeping one at least (Celery closes the children's Django ones after a task).
    clients = [c for c in show("CLIENTS") if c["database"] == name]
    assert len(clients) >= 3, clients
    with psycopg.connect(host="127.0.0.1", port=int(settings.PG_DIRECT_PORT),
                         user=connection.settings_dict["USER"], dbname="postgres") as direct:
        (sessions,) = direct.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [name]).fetchone()
    assert 0 < sessions <= pool_size
    # One client more than the pool: some server session serves two of them.
    port = int(os.environ["IDEM_PG_PORT"])
    extra = [psycopg.connect(host="127.0.0.1", port=port, user=connection.settings_dict["USER"],
                             dbname=name, autocommit=True) for _ in range(pool_size + 1)]
    try:
        pids = {conn.execute("SELECT pg_backend_pid()").fetchone()[0] for conn in extra}
    finally:
        for conn in extra:
            conn.close()
    assert len(pids) <= pool_size
