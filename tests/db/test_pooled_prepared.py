"""Prepared statements behind a real transaction pooler (PgBouncer 1.18, pool of one
server session): psycopg's ``prepared statement "_pg3_0" already exists``, as a second
client meets it, is raised by the library as a ConfigurationError naming
CELERY_IDEM_PREPARED_STATEMENTS, not as a bare database error."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from celery_idem.errors import ConfigurationError
from celery_idem.persistence import persistence
from tests.conftest import IN_CI
from tests.services import pgbouncer


@pytest.fixture
def bouncer():
    if connection.vendor != "postgresql":
        pytest.skip("PgBouncer stands in front of PostgreSQL")
    if pgbouncer.binary() is None:
        if IN_CI:
            pytest.fail("pgbouncer is not installed", pytrace=False)
        pytest.skip("pgbouncer is not installed")
    with pgbouncer.running(pool_size=1,
                           upstream_port=int(connection.settings_dict["PORT"] or 5432)) as b:
        yield b


def _client(bouncer):
    # Prepared from the first use, as the library's bookkeeping connection prepares.
    conn = psycopg.connect(host="127.0.0.1", port=bouncer.port, user="postgres",
                           dbname=connection.settings_dict["NAME"], autocommit=True)
    conn.prepare_threshold = 0
    return conn


def test_a_prepared_statement_met_on_a_shared_session_names_the_setting(db, bouncer):
    first, second = _client(bouncer), _client(bouncer)
    try:
        first.execute("SELECT 1", prepare=True)  # "_pg3_0" now exists on the one session
        with pytest.raises(ConfigurationError) as raised, persistence(), \
                connection.wrap_database_errors:
            second.execute("SELECT 2", prepare=True)  # its own "_pg3_0", same session
    finally:
        first.close()
        second.close()
    said = str(raised.value)
    assert "CELERY_IDEM_PREPARED_STATEMENTS = False" in said and "_pg3_0" in said
    assert raised.value.__cause__.__cause__.sqlstate == "42P05"
