"""The library's statements reuse one psycopg cursor per connection (backends.prepared):
made on first use, made again after a reconnect, and still wrapped by Django per
statement, so the query log sees every statement."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from celery_idem import connection as bookkeeping
from celery_idem.backends import prepared

pytestmark = [
    pytest.mark.skipif(settings.DATABASE_KIND != "postgres",
                       reason="the kept cursor is the PostgreSQL backend's (psycopg 3)"),
    pytest.mark.django_db(transaction=True),
]


def _one(conn, value: int) -> int:
    with prepared.cursor(conn) as cursor:
        cursor.execute("SELECT %(v)s::int", {"v": value})
        return cursor.fetchall()[0][0]


@pytest.mark.parametrize("which", ["django", "bookkeeping"])
def test_one_psycopg_cursor_serves_the_statements_until_a_reconnect(which):
    conn = connection if which == "django" else bookkeeping.bookkeeping_connection("default")
    try:
        with prepared.cursor(conn) as first:
            kept = first.cursor
        with prepared.cursor(conn) as second:
            assert second.cursor is kept
            assert second is not first  # Django's wrapper is made per statement
        assert [_one(conn, n) for n in (1, 2, 3)] == [1, 2, 3]
        assert not kept.closed  # the with block leaves it open for the next statement
        conn.close()
        assert _one(conn, 4) == 4
        with prepared.cursor(conn) as after:
            assert after.cursor is not kept
    finally:
        if which == "bookkeeping":
            bookkeeping.release_bookkeeping()


def test_the_query_log_sees_every_statement_on_the_kept_cursor():
    _one(connection, 0)  # the cursor exists before the log starts
    with CaptureQueriesContext(connection) as log:
        assert [_one(connection, n) for n in (5, 6)] == [5, 6]
    # Bound server-side: the log shows the placeholder, once per statement.
    assert [q["sql"] for q in log.captured_queries] == ["SELECT $1::int"] * 2
