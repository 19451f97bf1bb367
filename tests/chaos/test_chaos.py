"""The chaos suite, small (CI): tests/chaos/run.py on this tier's broker and kind of
database, in a process of its own (it starts its own PostgreSQL cluster or mariadbd, behind
a PgBouncer of its own on the PgBouncer tier, and, on Redis, its own Redis). It must
exit 0: nothing lost, nothing doubled, every repeat of the non-idempotent effect matched
to a fault, every history a path through the move table. Its report is printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.conf import settings

from tests.conftest import require_service
from tests.services import mariadb, pgbouncer

ROOT = Path(__file__).resolve().parents[2]
#: Small enough for CI (about two minutes per broker on 2 cores), large enough that every
#: kind of fault strikes and takes over running attempts.
SMALL = ["--jobs", "240", "--duration", "60"]
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _database() -> str:
    if settings.DATABASE_KIND == "mysql":
        if urlparse(settings.CELERY_BROKER_URL).scheme != "redis":
            pytest.skip("on MariaDB the chaos suite runs on the MariaDB + Redis tier")
        if not mariadb.available():
            pytest.fail("the chaos suite on MariaDB needs mariadb-install-db and mariadbd "
                        "(Debian's mariadb-server)")
        return "mariadb"
    if settings.PGBOUNCER:
        if urlparse(settings.CELERY_BROKER_URL).scheme != "redis":
            pytest.skip("behind PgBouncer the chaos suite runs on the PgBouncer + Redis tier")
        if pgbouncer.binary() is None:
            pytest.fail("the chaos suite behind PgBouncer needs pgbouncer (Debian's package)")
        return "pgbouncer"
    return "postgres"


def _broker() -> str:
    scheme = urlparse(settings.CELERY_BROKER_URL).scheme
    if settings.DATABASE_KIND == "mysql":
        return "redis"
    if settings.DATABASE_KIND != "postgres" or scheme not in ("redis", "amqp", "pyamqp"):
        pytest.skip("the chaos suite runs on the PostgreSQL + Redis, PostgreSQL + "
                    "RabbitMQ and MariaDB + Redis tiers (it restarts its own database)")
    if not (PG_BIN / "initdb").exists():
        pytest.fail(f"the chaos suite needs PostgreSQL 15's server binaries in {PG_BIN}")
    if scheme == "redis":
        return "redis"
    require_service("rabbitmq")
    return "rabbitmq"


def test_small_chaos_run_loses_and_doubles_nothing() -> None:
    _chaos(_database(), _broker())


def test_small_chaos_run_with_broker_durability_loses_and_doubles_nothing() -> None:
    """CELERY_IDEM_DURABILITY = "broker" (no intents) under the same faults, on RabbitMQ
    (which it needs: the Redis runs lose queued messages on purpose). Behind
    IDEM_FULL_MATRIX=1 (``tests/run.py --full``): CI's budget."""
    database, broker = _database(), _broker()
    if broker != "rabbitmq" or database != "postgres":
        pytest.skip("broker durability's chaos run is for PostgreSQL + RabbitMQ")
    if os.environ.get("IDEM_FULL_MATRIX") != "1":
        pytest.skip("broker durability's chaos run is in the full matrix (--full)")
    _chaos(database, broker, "--durability", "broker")


def _chaos(database: str, broker: str, *more: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    seed = os.environ.get("CHAOS_SEED")
    command = [sys.executable, str(ROOT / "tests" / "chaos" / "run.py"), "--broker", broker,
               "--database", database, *SMALL, *more, *(["--seed", seed] if seed else [])]
    run = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = run.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        # SIGTERM: the driver tears down its servers and workers before it exits.
        run.terminate()
        output, _ = run.communicate(timeout=120)
    print(output[-20000:])
    assert run.returncode == 0, f"the chaos run failed:\n{output[-8000:]}"
