"""Bad input is refused before any database write, so the caller's transaction lives on;
a bad key is refused by the key check on every job store, before anything is written or
sent (docs/explanation/reliability.md, "Bad inputs")."""

from __future__ import annotations

import pytest
from celery.signals import before_task_publish
from django.conf import settings
from django.db import transaction

from celery_idem.backends import get_backend
from celery_idem.backends.generic import GenericBackend
from celery_idem.errors import ArgumentsNotJSON, InvalidKey
from celery_idem.keys import KEY_MAX_LENGTH
from celery_idem.models import Job
from celery_idem.producer import KEY_HEADER
from celery_idem.testing import InMemoryBackend, use_backend
from django_app.effects.models import Effect
from django_app.effects.tasks import add, notify, ship_order

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


# -- bad keys, on every backend, before anything is written or sent ---------------------

BAD_KEYS = [
    pytest.param("", id="empty"),
    pytest.param("   ", id="blank"),
    pytest.param("k" * (KEY_MAX_LENGTH + 1), id="too-long"),
    pytest.param(42, id="not-a-string"),
    pytest.param(b"order/1", id="bytes"),
    pytest.param("order/1\x00", id="nul"),
]


@pytest.fixture(params=["memory", "generic", "native"])
def store(request):
    """Each job store the library renders the moves in, used by the whole library."""
    if request.param == "native" and settings.DATABASE_KIND != "postgres":
        pytest.skip("the native SQL backend is PostgreSQL's; this tier runs another database")
    chosen = {"memory": InMemoryBackend, "generic": GenericBackend}.get(request.param)
    with use_backend(chosen("default") if chosen else get_backend("default")) as backend:
        yield backend


@pytest.fixture
def published():
    """The messages Celery was about to publish while the test ran (its own signal)."""
    seen: list[str] = []

    def record(sender=None, **_):
        seen.append(sender)

    before_task_publish.connect(record, weak=False)
    yield seen
    before_task_publish.disconnect(record)


def stored_rows(store) -> int:
    return len(store.jobs) if isinstance(store, InMemoryBackend) else Job.objects.count()


@pytest.mark.parametrize("key", BAD_KEYS)
@pytest.mark.parametrize("how", ["idempotency_key", "headers"])
def test_a_bad_key_is_refused_before_anything_is_written_or_sent(store, published, key, how):
    """apply_async(idempotency_key=...) and a key put in the headers by hand: InvalidKey
    from the key check, on every store, with no row written and no message published."""
    options = ({"idempotency_key": key} if how == "idempotency_key"
               else {"headers": {KEY_HEADER: key}})
    with pytest.raises(InvalidKey):
        notify.apply_async((1, "hi"), **options)
    assert stored_rows(store) == 0
    assert published == []


def test_a_template_key_that_grows_too_long_is_refused_before_sending(store, published):
    """ship/{order_id} with a 300-character order id: InvalidKey names the limit."""
    with pytest.raises(InvalidKey, match=f"the most is {KEY_MAX_LENGTH}"):
        ship_order.delay("9" * 300)
    assert stored_rows(store) == 0
    assert published == []


@pytest.mark.parametrize("key", BAD_KEYS)
def test_a_message_arriving_with_a_bad_key_fails_before_its_claim(store, key):
    """A message from another producer whose key header is bad: the worker fails it with
    InvalidKey before claiming; the body never runs, nothing is written."""
    result = notify.apply((1, "hi"), headers={KEY_HEADER: key})
    assert result.failed() and isinstance(result.result, InvalidKey)
    assert stored_rows(store) == 0
    assert not Effect.objects.exists()
