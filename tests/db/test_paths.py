"""Call paths and bad input in-process: atomic on another database, the caller's
transaction, KeyMismatch's message, and the one ``except`` for a failed key."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from celery_idem import ConfigurationError, KeyMismatch, PersistenceError, StoredFailure
from celery_idem.models import Job
from celery_idem.producer import KEY_HEADER
from django_app.effects.models import Effect
from django_app.effects.tasks import always_fails, deduct_stock, ship_order

pytestmark = pytest.mark.django_db(transaction=True)


def run(task, *args, **kwargs):
    key = task.intent(args, kwargs).key
    return task.apply(args=args, kwargs=kwargs, headers={KEY_HEADER: key})


class TestAtomicDatabase:
    def test_atomic_task_with_job_tables_elsewhere_is_refused_before_the_body(
            self, backend, settings, monkeypatch):
        # An alias that exists (the setting is checked), never connected to: refused first.
        monkeypatch.setitem(settings.DATABASES, "jobs", {})
        settings.CELERY_IDEM_DATABASE = "jobs"
        outcome = run(deduct_stock, 1, 2, 3)
        assert isinstance(outcome.result, ConfigurationError)
        assert "atomic_database='jobs'" in str(outcome.result)
        assert not Effect.objects.exists()

    def test_a_declaration_that_names_another_database_is_refused(self, backend,
                                                                  monkeypatch):
        monkeypatch.setattr(deduct_stock._get_current_object(), "atomic_database", "other")
        outcome = run(deduct_stock, 1, 2, 3)
        assert isinstance(outcome.result, ConfigurationError)
        assert not Effect.objects.exists()

    def test_declared_job_database_runs(self, backend, monkeypatch):
        monkeypatch.setattr(deduct_stock._get_current_object(), "atomic_database", "default")
        assert run(deduct_stock, 1, 2, 3).get() == {"deducted": 3, "attempt": 1}


class TestCallersTransaction:
    def test_a_database_error_writing_the_intent_leaves_the_callers_transaction_usable(
            self, backend, backend_kind, monkeypatch):
        """The intent write fails on the server inside the caller's transaction: only its
        savepoint rolls back. On PostgreSQL the intent's own statement fails (it is sent
        with its savepoint, in one round trip); elsewhere a statement the write runs."""
        if backend_kind == "native" and connection.vendor == "postgresql":
            from celery_idem.backends import postgresql

            monkeypatch.setattr(postgresql, "insert_sql",
                                lambda event: "SELECT * FROM no_such_table_celery_idem")
        else:
            real = backend.publish

            def broken(*args, **kwargs):
                with connection.cursor() as cursor:
                    cursor.execute("SELECT * FROM no_such_table_celery_idem")
                return real(*args, **kwargs)

            monkeypatch.setattr(backend, "publish", broken)
        with transaction.atomic():
            Effect.objects.create(key="before")
            with pytest.raises(PersistenceError):
                ship_order.delay(7)
            Effect.objects.create(key="after")  # would fail: "transaction is aborted"
        assert set(Effect.objects.values_list("key", flat=True)) == {"before", "after"}
        assert not Job.objects.exists()

    def test_intent_written_inside_the_callers_transaction_commits_with_it(self, backend):
        with transaction.atomic():
            ship_order.delay(8)
        assert Job.objects.filter(key="ship/8").exists()


def test_key_mismatch_names_the_stored_and_the_new_arguments(backend):
    ship_order.apply_async(args=(1,), idempotency_key="shared")
    with pytest.raises(KeyMismatch) as raised:
        ship_order.apply_async(args=(2,), idempotency_key="shared")
    message = str(raised.value)
    assert "{'args': [1], 'kwargs': {}}" in message and "{'args': [2], 'kwargs': {}}" in message
    assert raised.value.details["stored"] == {"args": [1], "kwargs": {}}


def test_key_mismatch_without_stored_arguments_names_fingerprints(backend, settings):
    settings.CELERY_IDEM_STORE_ARGUMENTS = False
    ship_order.apply_async(args=(1,), idempotency_key="pii")
    with pytest.raises(KeyMismatch, match="fingerprint"):
        ship_order.apply_async(args=(2,), idempotency_key="pii")


def test_one_except_handles_the_first_caller_and_a_duplicate_of_a_failed_key(backend):
    """The body's own exception class catches the first failure and its replays."""
    caught = []
    for _ in range(2):
        try:
            run(always_fails, 5).get()
        except ValueError as exc:
            caught.append(exc)
    first, duplicate = caught
    assert type(first) is ValueError
    assert isinstance(duplicate, StoredFailure) and duplicate.args == first.args
    assert Effect.objects.filter(key="fail/5").count() == 1
