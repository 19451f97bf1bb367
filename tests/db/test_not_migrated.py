"""A project that did not run ``migrate`` on the job database gets an error that says so,
at the first publish, on every database (each says "no
such table" its own way: celery_idem/installation.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, transaction

from celery_idem import connection as bookkeeping
from celery_idem.errors import NotMigrated
from celery_idem.models import Job
from django_app.effects.models import Effect
from django_app.effects.tasks import ship_order

pytestmark = pytest.mark.django_db(transaction=True)

AWAY = "celery_idem_job_not_migrated"


@pytest.fixture
def job_table_missing() -> Iterator[None]:
    """The job table renamed away (as before ``migrate``), and back afterwards."""
    table = Job._meta.db_table
    with connection.schema_editor() as editor:
        editor.alter_db_table(Job, table, AWAY)
    try:
        yield
    finally:
        bookkeeping.close_bookkeeping_connections()  # its plans name the old table
        with connection.schema_editor() as editor:
            editor.alter_db_table(Job, AWAY, table)


@pytest.mark.usefixtures("job_table_missing")
def test_publishing_before_migrate_raises_not_migrated_naming_the_fix():
    with pytest.raises(NotMigrated, match=r"do not exist on database 'default'.*"
                                          r"run manage\.py migrate"):
        ship_order.delay(1)


@pytest.mark.usefixtures("job_table_missing")
def test_publishing_in_a_transaction_before_migrate_raises_not_migrated():
    """The outbox path: the intent goes through the caller's own connection."""
    with pytest.raises(NotMigrated), transaction.atomic():
        Effect.objects.create(key="before")
        ship_order.delay(2)
    assert not Effect.objects.exists()
