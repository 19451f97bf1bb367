"""The settings' system checks: a serializer other than JSON (E013), prepared statements
behind a transaction pooler (E014, and psycopg's error at run time named as the setting's),
and the check registry every check builds its messages from."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import ProgrammingError
from django.test import override_settings
from psycopg import errors as pg_errors

from celery_idem import checks_settings
from celery_idem.check_ids import CHECKS
from celery_idem.errors import ConfigurationError
from celery_idem.persistence import persistence
from tests.unit.test_checks import celery_app, ids  # noqa: F401 (the fixture)


@pytest.mark.parametrize(("name", "value", "named"), [
    ("task_serializer", "pickle", "CELERY_TASK_SERIALIZER is 'pickle'"),
    ("result_serializer", "yaml", "CELERY_RESULT_SERIALIZER is 'yaml'"),
    ("accept_content", ["json", "pickle"], "CELERY_ACCEPT_CONTENT accepts 'pickle'"),
    ("result_accept_content", ["application/x-python-serialize"],
     "CELERY_RESULT_ACCEPT_CONTENT accepts 'application/x-python-serialize'"),
])
def test_a_serializer_other_than_json_is_e013(celery_app, name, value, named):  # noqa: F811
    celery_app.conf[name] = value
    (message,) = checks_settings.check_serializers()
    assert message.id == "celery_idem.E013" and named in message.msg


def test_json_by_name_or_mime_type_passes(celery_app):  # noqa: F811
    celery_app.conf.accept_content = ["json", "application/json"]
    assert checks_settings.check_serializers() == []


@pytest.mark.parametrize(("config", "sign"), [
    ({"PORT": 6432}, "PORT is 6432"),
    ({"PORT": "6432", "HOST": "db"}, "PORT is 6432"),
    ({"DISABLE_SERVER_SIDE_CURSORS": True}, "DISABLE_SERVER_SIDE_CURSORS"),
    ({"HOST": "pgbouncer.internal"}, "HOST is 'pgbouncer.internal'"),
])
def test_a_transaction_pooler_is_told_by_the_database_settings(config, sign):
    (found,) = checks_settings.pooler_signs(config)
    assert sign in found
    assert checks_settings.pooler_signs({"PORT": 5432, "HOST": "db"}) == []


def test_prepared_statements_behind_a_pooler_is_e014(monkeypatch):
    alias = "default"
    monkeypatch.setitem(settings.DATABASES, alias, {
        **settings.DATABASES[alias], "ENGINE": "django.db.backends.postgresql",
        "PORT": 6432})
    assert checks_settings.check_pooled_prepared() == []  # the setting is off
    with override_settings(CELERY_IDEM_PREPARED_STATEMENTS=True):
        (message,) = checks_settings.check_pooled_prepared()
    assert message.id == "celery_idem.E014"
    assert "CELERY_IDEM_PREPARED_STATEMENTS" in message.msg
    assert "CELERY_IDEM_PREPARED_STATEMENTS = False" in message.hint


@pytest.mark.parametrize("sqlstate", ["42P05", "26000"])
def test_a_prepared_statement_on_another_session_is_a_configuration_error(sqlstate):
    """psycopg's 'prepared statement "_pg3_0" already exists' (or does not exist), as
    Django raises it, becomes an error that names the setting, not a persistence error."""
    driver = pg_errors.lookup(sqlstate)('prepared statement "_pg3_0" already exists')
    with pytest.raises(ConfigurationError, match="CELERY_IDEM_PREPARED_STATEMENTS = False"):
        with persistence():
            raise ProgrammingError(str(driver)) from driver


def test_every_check_id_is_registered_with_its_meaning_and_fix():
    for code, check in CHECKS.items():
        assert check.id == f"celery_idem.{code}" and code[0] in "EW"
        assert check.level == ("error" if code[0] == "E" else "warning")
        assert check.title and check.meaning and check.fix
    assert CHECKS["E012"]("x").hint == CHECKS["E012"].fix.replace("`", "")
