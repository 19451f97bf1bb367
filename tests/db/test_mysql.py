"""MariaDB/MySQL specifics: keys compared byte for byte, the isolation level a losing claim
needs, the engine check, the driver and its pools. Keys run on every database."""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from celery_idem import checks_mysql
from celery_idem.backends import Claimant
from celery_idem.backends.generic import GenericBackend
from celery_idem.models import Job

on_mysql = pytest.mark.skipif(connection.vendor != "mysql", reason="MySQL/MariaDB only")
pytestmark = pytest.mark.django_db(transaction=True)


def claimant(worker: str, task_id: str) -> Claimant:
    now = timezone.now()
    return Claimant(worker, task_id, now, now + timedelta(seconds=60))


def test_keys_that_differ_only_in_case_or_a_trailing_space_are_distinct(backend, make_intent):
    """MySQL's default collations would make these one key (schema.binary_key_columns)."""
    keys = ["Order-1", "order-1", "order-1 "]
    for n, key in enumerate(keys):
        backend.publish(make_intent(key, fingerprint=f"fp-{n}"), f"t-{n}", timezone.now())
    assert sorted(Job.objects.filter(namespace="tests").values_list("key", "fingerprint")) \
        == sorted((key, f"fp-{n}") for n, key in enumerate(keys))
    assert Job.objects.get(namespace="tests", key="order-1").fingerprint == "fp-1"


@on_mysql
@pytest.mark.parametrize("level, seen", [("READ COMMITTED", "SUCCEEDED"),
                                         ("REPEATABLE READ", "PENDING")])
def test_a_claim_that_loses_after_a_read_in_its_transaction(make_intent, level, seen):
    """The winner commits between the transaction's first read and the claim. Under READ
    COMMITTED (the settings' level) the losing claim reads the winner's outcome; under
    REPEATABLE READ it reads the row as the first read saw it, hence check W010."""
    backend, intent = GenericBackend("default"), make_intent("stale")
    backend.publish(intent, "t-0", timezone.now())

    def winner() -> None:  # another session: Django's connections are per thread
        try:
            Job.objects.filter(key="stale").update(state="SUCCEEDED", attempt=1)
        finally:
            connections.close_all()

    with transaction.atomic():
        with connection.cursor() as cursor:  # this transaction only, before it starts
            cursor.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        assert Job.objects.get(key="stale").state == "PENDING"
        thread = threading.Thread(target=winner)
        thread.start()
        thread.join(30)
        outcome = backend.claim("claimed", intent, claimant("w/2", "t-2"))
    assert not outcome.won and outcome.row is not None
    assert outcome.row.state.value == seen


@on_mysql
def test_a_celery_idem_table_not_on_innodb_is_e011(monkeypatch):
    assert checks_mysql.check_mysql_engine(databases=["default"]) == []
    tables = checks_mysql._tables()
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE idem_check_myisam (id int PRIMARY KEY) ENGINE=MyISAM")
    try:
        monkeypatch.setattr(checks_mysql, "_tables", lambda: [*tables, "idem_check_myisam"])
        assert checks_mysql.check_mysql_engine() == []  # without --database: no query
        messages = checks_mysql.check_mysql_engine(databases=["default"])
        assert [m.id for m in messages] == ["celery_idem.E011"]
        assert "idem_check_myisam (MyISAM)" in messages[0].msg
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE idem_check_myisam")


@on_mysql
def test_the_connection_is_on_the_driver_the_tier_asks_for():
    """IDEM_MYSQL_DRIVER=pymysql stands PyMySQL in for MySQLdb (django_app/settings.py):
    the mariadb-pymysql tier really runs on it."""
    driver = os.environ.get("IDEM_MYSQL_DRIVER", "mysqlclient")
    connection.ensure_connection()
    module = type(connection.connection).__module__
    assert module.startswith("pymysql" if driver == "pymysql" else "MySQLdb"), module


@on_mysql
def test_found_rows_is_the_drivers_constant():
    from MySQLdb.constants import CLIENT  # mysqlclient, or PyMySQL standing in for it

    assert CLIENT.FOUND_ROWS == checks_mysql.FOUND_ROWS


@on_mysql
def test_gevent_is_e005_on_mysqlclient_and_not_on_pymysql(monkeypatch):
    """mysqlclient waits for a row lock in C: under gevent the greenlet holding the lock
    never resumes (tried: atomic duplicates on -P gevent hit the 50 s lock wait timeout);
    PyMySQL's sockets are gevent's, and the same test passes."""
    from celery import Celery

    from celery_idem import checks

    app = Celery("mysql-pool-check", set_as_current=False)
    app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True,
                    worker_pool="gevent")
    monkeypatch.setattr(checks, "_celery_app", lambda: app)
    found = [m.id for m in checks.check_celery_settings()]
    pymysql = os.environ.get("IDEM_MYSQL_DRIVER") == "pymysql"
    assert found == ([] if pymysql else ["celery_idem.E005"])
