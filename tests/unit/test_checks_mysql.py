"""The MySQL/MariaDB settings checks: each fires on the setting that breaks the claim
there and not on Django's defaults (the engine check, which reads the server, is in
tests/db/test_mysql.py)."""

from __future__ import annotations

import pytest

from celery_idem import checks_mysql

MYSQL = {"ENGINE": "django.db.backends.mysql", "NAME": "idem"}


def ids(options: dict, engine: dict = MYSQL) -> list[str]:
    found = checks_mysql.mysql_options({**engine, "OPTIONS": options})
    return [] if found is None else sorted(
        m.id for m in checks_mysql.option_messages("default", found))


def test_djangos_defaults_pass():
    assert ids({}) == []
    assert ids({"isolation_level": "read committed", "charset": "utf8mb4"}) == []


def test_client_flags_without_found_rows_are_e010():
    """Django sets CLIENT.FOUND_ROWS, but OPTIONS replaces it wholesale."""
    multi_statements = 1 << 16
    assert ids({"client_flag": multi_statements}) == ["celery_idem.E010"]
    assert ids({"client_flag": multi_statements | checks_mysql.FOUND_ROWS}) == []


def test_found_rows_is_pymysqls_constant():
    """PyMySQL's (pure Python, in the test extra); mysqlclient's, a C extension, is
    checked where it is installed (tests/db/test_mysql.py)."""
    from pymysql.constants import CLIENT

    assert CLIENT.FOUND_ROWS == checks_mysql.FOUND_ROWS


@pytest.mark.parametrize("level", ["repeatable read", "REPEATABLE READ"])
def test_repeatable_read_is_w010(level):
    assert ids({"isolation_level": level}) == ["celery_idem.W010"]


@pytest.mark.parametrize("level", ["read committed", "serializable", "read uncommitted"])
def test_other_levels_are_not_w010(level):
    """SERIALIZABLE makes InnoDB's reads in a transaction locking reads: they see the
    winner (a lock wait, not a stale row)."""
    assert ids({"isolation_level": level}) == []


def test_other_databases_are_not_checked():
    assert ids({"client_flag": 0, "isolation_level": "repeatable read"},
               {"ENGINE": "django.db.backends.postgresql", "NAME": "idem"}) == []
