"""Database tests run on the tier's database (SQLite, PostgreSQL or MariaDB) and, on
PostgreSQL and MariaDB, against both the database's own backend (``native``: named
queries) and the portable ORM fallback (the only backend on SQLite)."""

from __future__ import annotations

import pytest
from django.conf import settings

from celery_idem.backends import get_backend
from celery_idem.backends.generic import GenericBackend
from celery_idem.backends.values import Intent
from celery_idem.testing import use_backend

#: Test helper modules with asserts of their own (the admin actions' operator, the model
#: test's rows and rules, the recovery pass's helpers): pytest rewrites them as it does a
#: test module, so a failing assert shows its values. Registered before a test imports them.
pytest.register_assert_rewrite("tests.db.admin_operator", "tests.db.model_rows",
                               "tests.db.model_rules", "tests.db.reaping")

#: Tests of SQL that only PostgreSQL runs; they run in the postgres tiers.
POSTGRES_ONLY = ["test_claim_plan.py"]
collect_ignore = POSTGRES_ONLY if settings.DATABASE_KIND != "postgres" else []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_kind" in metafunc.fixturenames:
        kinds = ["generic"] if settings.DATABASE_KIND == "sqlite" else ["native", "generic"]
        metafunc.parametrize("backend_kind", kinds)


@pytest.fixture
def backend(backend_kind):
    """The backend under test, used by the whole library while the test runs."""
    chosen = GenericBackend("default") if backend_kind == "generic" else get_backend("default")
    with use_backend(chosen):
        yield chosen


@pytest.fixture
def make_intent():
    def make(key: str = "k1", fingerprint: str = "fp-1", namespace: str = "tests") -> Intent:
        return Intent(namespace=namespace, key=key, task_name="tests.task",
                      fingerprint=fingerprint, args=[1], kwargs={"a": "b"},
                      options={"queue": "q"})
    return make
