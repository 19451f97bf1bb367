"""The benchmarks' smoke tests' environments: a throwaway database per module (PostgreSQL,
``idem_bench_smoke_*``, dropped after), and the stacks of ``--stack``."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.conftest import IN_CI, require_service

from .runner import ROOT


@pytest.fixture(scope="module")
def bench_env(tmp_path_factory):
    for service in ("postgres", "redis", "rabbitmq"):
        require_service(service)
    name = f"idem_bench_smoke_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "IDEM_PG_NAME": name,
           "IDEM_VAR_DIR": str(tmp_path_factory.mktemp("bench-var")),
           "PYTHONPATH": str(ROOT)}
    env.pop("IDEM_DB_NAME", None)
    yield env
    import psycopg

    with psycopg.connect(dbname="postgres", user="postgres", host="127.0.0.1",
                         autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["pgbouncer", "mysql"])
def stack_env(request, bench_env):
    """A stack of ``--stack`` (bench/lib/stacks.py) other than PostgreSQL directly, whose
    service must be there: a missing PgBouncer binary or MariaDB fails in CI."""
    if request.param == "mysql":
        require_service("mariadb")
    else:
        from tests.services.pgbouncer import binary

        if binary() is None:
            message = "pgbouncer is not installed (Debian: apt-get install pgbouncer)"
            if IN_CI:
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
    env = {**bench_env, "IDEM_MYSQL_NAME": bench_env["IDEM_PG_NAME"]}
    yield request.param, env
    if request.param == "mysql":
        import MySQLdb

        conn = MySQLdb.connect(host="127.0.0.1", port=3306, user="root")
        try:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{env['IDEM_MYSQL_NAME']}`")
        finally:
            conn.close()
