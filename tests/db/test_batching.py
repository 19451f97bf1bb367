"""Batch publishing (celery_idem.batching): N publishes in a batch are one intent
statement, on each backend and database, outside a transaction and inside one; each key
keeps the guarantees of a single publish (one job per key, KeyMismatch, its own stored
message, nothing written for a block that raised or a savepoint rolled back)."""

from __future__ import annotations

import re

import pytest
from celery import current_app, group
from django.db import connection, transaction

from celery_idem import KeyMismatch, batch, lean_envelope, publish_many
from celery_idem.connection import bookkeeping_connection, release_bookkeeping
from celery_idem.models import Job
from tests.pgtrace import round_trips

from .test_round_trips import echo, statements

pytestmark = pytest.mark.django_db(transaction=True)

N = 5
#: A batch's statements outside a transaction: the native one writes the intents with one
#: statement; the portable one with a multi-row INSERT and one read of the batch's keys.
EXPECTED = {"PostgreSQLBackend": 1, "MySQLBackend": 2, "GenericBackend": 2}


def _inserts(sqls: dict[str, list[str]]) -> list[str]:
    return [sql for found in sqls.values() for sql in found
            if sql.lstrip().upper().startswith(("INSERT", "WITH"))]


def _publish(first: int, n: int = N) -> None:
    for i in range(first, first + n):
        echo.apply_async(args=(i,))


def test_a_batch_is_one_intent_statement_outside_a_transaction(backend, backend_kind):
    """N apply_async in a batch: one statement writes the N intents (a second reads the
    rows back on the portable backend), where N alone would be N statements."""
    def batched():
        with batch():
            _publish(100)

    sqls = statements(batched)
    assert sum(map(len, sqls.values())) == EXPECTED[type(backend).__name__]
    assert len(_inserts(sqls)) == 1
    assert Job.objects.filter(key__startswith="echo/10").count() == N
    assert not Job.objects.filter(key__startswith="echo/10", message__isnull=True).exists()
    assert not Job.objects.filter(key__startswith="echo/10", sent_at__isnull=True).exists()


def test_a_batch_is_one_round_trip_on_the_bookkeeping_connection(backend_kind):
    """PostgreSQL: the batch's intents are one round trip (one flushed commit)."""
    if backend_kind != "native" or connection.vendor != "postgresql":
        pytest.skip("the bookkeeping connection is the PostgreSQL backend's")
    wrapper = bookkeeping_connection(connection.alias)
    release_bookkeeping()

    def batched():
        with batch():
            _publish(200)

    assert round_trips(wrapper, batched) == 1


def test_in_a_transaction_the_intents_are_one_statement_and_the_sent_marks_one_more(
        backend, backend_kind):
    """Inside atomic(): the intents in the caller's transaction with one statement, no
    message before the commit; after it, the messages leave and are marked sent."""
    with transaction.atomic():
        sqls = statements(lambda: _run_batch(300))
        assert len(_inserts(sqls)) == 1
        assert sqls.get("bookkeeping", []) == []
        assert Job.objects.filter(key__startswith="echo/30", sent_at__isnull=True).count() == N
    assert not Job.objects.filter(key__startswith="echo/30", sent_at__isnull=True).exists()


def _run_batch(first: int) -> None:
    with batch():
        _publish(first)


def test_the_sent_marks_after_the_commit_are_one_statement(backend, backend_kind):
    """The outbox's second half for a batch: the N ``sent`` moves in one UPDATE (the
    portable backend reads the rows it moves first, locking them)."""
    def committed():
        with transaction.atomic():
            _run_batch(400)

    sqls = statements(committed)
    updates = [sql for found in sqls.values() for sql in found
               if re.search(r'sent_at["`]? = ', sql)]
    assert len(updates) == 1
    assert not Job.objects.filter(key__startswith="echo/40", sent_at__isnull=True).exists()


def test_a_key_repeated_in_a_batch_is_one_job(backend):
    with batch():
        echo.apply_async(args=(500,))
        echo.apply_async(args=(500,))
        echo.apply_async(args=(501,))
    assert Job.objects.filter(key__in=["echo/500", "echo/501"]).count() == 2


def test_a_mismatch_raises_at_the_end_after_the_other_keys(backend):
    """A key stored with other arguments: KeyMismatch when the batch ends; the batch's
    other keys are written (and their messages sent)."""
    echo.apply_async(args=(600,), idempotency_key="taken/600")
    with pytest.raises(KeyMismatch), batch():
        echo.apply_async(args=(601,))
        echo.apply_async(args=(999,), idempotency_key="taken/600")
        echo.apply_async(args=(602,))
    assert Job.objects.filter(key__in=["echo/601", "echo/602"]).count() == 2
    assert Job.objects.get(key="taken/600").args == [600]


def test_a_mismatch_within_the_batch_itself(backend):
    with pytest.raises(KeyMismatch), batch():
        echo.apply_async(args=(700,), idempotency_key="twice/700")
        echo.apply_async(args=(701,), idempotency_key="twice/700")
    assert Job.objects.get(key="twice/700").args == [700]


def test_a_block_that_raises_writes_nothing(backend):
    with pytest.raises(RuntimeError), batch():
        _publish(800)
        raise RuntimeError
    assert not Job.objects.filter(key__startswith="echo/80").exists()


def test_a_savepoint_rolled_back_in_a_batch_takes_its_publish_back(backend):
    """A publish inside an atomic() opened within the batch is written at once, in that
    savepoint: its rollback removes it; the batch's own publishes stay."""
    with transaction.atomic(), batch():
        echo.apply_async(args=(900,))
        with pytest.raises(RuntimeError), transaction.atomic():
            echo.apply_async(args=(901,))
            raise RuntimeError
    assert list(Job.objects.filter(key__in=["echo/900", "echo/901"])
                .values_list("key", flat=True)) == ["echo/900"]


def test_publish_many_takes_signatures_or_a_group(backend, backend_kind):
    """publish_many: a list of signatures or one group, each one intent statement."""
    sqls = statements(lambda: publish_many([echo.s(1000 + i) for i in range(N)]))
    assert len(_inserts(sqls)) == 1
    sqls = statements(lambda: publish_many(group(echo.s(1100 + i) for i in range(N))))
    assert len(_inserts(sqls)) == 1
    assert Job.objects.filter(key__regex=r"^echo/1[01]0[0-9]$").count() == 2 * N


def test_each_row_of_a_batch_keeps_its_own_message_and_eta(backend):
    """The envelope, ETA and expiry of each message land on its own row, as a single
    publish writes them (a re-send publishes that message)."""
    with batch():
        echo.apply_async(args=(1200,), countdown=600, expires=3600)
        echo.apply_async(args=(1201,))
    later, now = Job.objects.get(key="echo/1200"), Job.objects.get(key="echo/1201")
    assert later.not_before is not None and later.expires_at is not None
    assert later.not_before < later.expires_at
    assert now.not_before is None and now.expires_at is None
    sent = {job.key: lean_envelope.expand(current_app, job.message, job, job.task_id)
            for job in (later, now)}
    assert sent["echo/1200"]["body"][0] == [1200] and sent["echo/1201"]["body"][0] == [1201]
    assert sent["echo/1200"]["headers"].get("eta") is not None
    assert sent["echo/1201"]["headers"].get("eta") is None


def test_a_mismatch_caught_inside_the_transaction_keeps_the_other_keys(backend):
    """In atomic(): KeyMismatch at the batch's end leaves the transaction usable; caught,
    the other keys commit and their messages leave (marked sent)."""
    echo.apply_async(args=(1300,), idempotency_key="taken/1300")
    with transaction.atomic():
        with pytest.raises(KeyMismatch), batch():
            echo.apply_async(args=(1301,))
            echo.apply_async(args=(1399,), idempotency_key="taken/1300")
        assert Job.objects.filter(key="echo/1301", sent_at__isnull=True).exists()
    assert Job.objects.filter(key="echo/1301", sent_at__isnull=False).exists()
    assert Job.objects.get(key="taken/1300").args == [1300]
