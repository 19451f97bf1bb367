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


def _fetch(conn, value) -> list:
    return prepared.fetch(conn, "SELECT %(v)s::int", {"v": value})


@pytest.mark.parametrize("which", ["django", "bookkeeping"])
def test_unobserved_statements_skip_djangos_wrapper_and_keep_its_errors(which, monkeypatch):
    """``fetch``: once the cursor is kept, a statement nobody observes runs on it without
    Django's wrapper; a database error is still Django's; a statement an execute wrapper
    or the query log would see goes through the wrapper (and is seen); so does the first
    one after a reconnect (a new kept cursor) or a change of the settings it was made
    for, and the next one is unwrapped again."""
    from django.db import DataError
    from django.test import override_settings

    conn = connection if which == "django" else bookkeeping.bookkeeping_connection("default")
    made = []
    real = conn._prepare_cursor
    monkeypatch.setattr(conn, "_prepare_cursor", lambda c: made.append(c) or real(c))

    def wrapped(value) -> bool:
        """Whether Django wrapped the statement that fetched ``value``."""
        before = len(made)
        assert _fetch(conn, value) == [(value,)]
        return len(made) > before

    try:
        assert wrapped(1)  # the kept cursor made, through the wrapper
        assert not wrapped(2)
        with pytest.raises(DataError):
            prepared.fetch(conn, "SELECT %(v)s::int", {"v": "not a number"})
        seen = []
        with conn.execute_wrapper(lambda execute, sql, *rest: seen.append(sql)
                                  or execute(sql, *rest)):
            assert wrapped(3)
        with CaptureQueriesContext(conn) as log:
            assert wrapped(4)
        assert (len(seen), len(log.captured_queries)) == (1, 1)
        with override_settings(CELERY_IDEM_PREPARED_STATEMENTS=True):
            assert wrapped(5)
        assert wrapped(6) and not wrapped(7)  # the setting back as it was
        conn.close()
        assert wrapped(8) and not wrapped(9)
    finally:
        if which == "bookkeeping":
            bookkeeping.release_bookkeeping()
