"""Bad input is refused before any database write, so the caller's transaction lives on."""

from __future__ import annotations

import pytest
from django.db import transaction

from celery_idem.errors import ArgumentsNotJSON, InvalidKey
from celery_idem.models import Job
from django_app.effects.models import Effect
from django_app.effects.tasks import add, notify

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("publish,error", [
    (lambda: notify.apply_async((1, "hi"), idempotency_key="n/\x00"), InvalidKey),
    (lambda: add.delay("a\x00b"), ArgumentsNotJSON),
    (lambda: add.delay({"nested": ["\x00"]}), ArgumentsNotJSON),
])
def test_nul_is_refused_inside_the_callers_transaction_which_still_works(publish, error):
    """Found on PostgreSQL: a NUL reached the database, failed as PersistenceError and
    aborted the caller's transaction. Now the call fails and the transaction commits."""
    with transaction.atomic():
        Effect.objects.create(key="before")
        with pytest.raises(error, match="NUL"):
            publish()
        Effect.objects.create(key="after")
    assert set(Effect.objects.values_list("key", flat=True)) == {"before", "after"}
    assert not Job.objects.exists()
