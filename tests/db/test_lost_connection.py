"""``backends.lost``: a database error whose connection the server closed, against one
whose connection still works (the body's own), on real connections of every database."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection, transaction

from celery_idem.backends import lost_connection

pytestmark = pytest.mark.django_db(transaction=True)


def own_error() -> OperationalError:
    """An OperationalError that leaves the connection working: a statement timeout on the
    servers (inside a transaction, which it aborts), a missing table on SQLite."""
    with pytest.raises(OperationalError) as raised, transaction.atomic(), \
            connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL statement_timeout = 1")
            cursor.execute("SELECT pg_sleep(1)")
        elif connection.vendor == "mysql":
            cursor.execute("SET STATEMENT max_statement_time=0.001 FOR SELECT SLEEP(1)")
        else:
            cursor.execute("SELECT * FROM no_such_table")
    return raised.value


def test_an_error_on_a_working_connection_is_the_bodys_own():
    assert lost_connection(own_error()) is None


def test_a_connection_the_server_closed_is_lost():
    if connection.vendor == "sqlite":
        pytest.skip("a SQLite file has no session to end")
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()" if connection.vendor == "mysql"
                       else "SELECT pg_backend_pid()")
        session = cursor.fetchone()[0]
    killer = connection.copy()  # another session of the same database
    try:
        with killer.cursor() as cursor:
            if connection.vendor == "mysql":
                cursor.execute(f"KILL CONNECTION {int(session)}")
            else:
                cursor.execute("SELECT pg_terminate_backend(%s)", [session])
    finally:
        killer.close()
    try:
        with pytest.raises(OperationalError) as raised, connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        assert lost_connection(raised.value) == connection.alias
    finally:
        connection.close()


def test_only_database_connection_errors_are_asked_about():
    assert lost_connection(ValueError("boom")) is None
    assert lost_connection(OperationalError("no connection was used")) is None
