"""``CELERY_IDEM_DURABILITY = "broker"``: the producer writes nothing, the worker's claim
inserts the row in one statement, a mismatch is found at the worker, and a publish in a
transaction leaves on commit with no row in it. Statement counts on every database the
tier has (PostgreSQL: both backends; MariaDB and SQLite: the portable one)."""

from __future__ import annotations

import pytest
from celery import group, shared_task
from django.db import transaction

from celery_idem import IdempotentTask, batching
from celery_idem.backends import routines
from celery_idem.errors import KeyMismatch
from celery_idem.models import Job
from celery_idem.producer import KEY_HEADER, UNWRITTEN_HEADER
from tests.db.test_round_trips import count, echo, statements

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broker_durability(settings):
    settings.CELERY_IDEM_DURABILITY = "broker"


def unwritten(key: str) -> dict[str, object]:
    """The headers of a message published in broker mode."""
    return {KEY_HEADER: key, UNWRITTEN_HEADER: True}


def test_a_publish_writes_no_statement_and_marks_its_message(backend, broker_durability,
                                                            sent):
    """Nothing reaches the database at publish; the message carries the key and says
    that no intent was written."""
    assert count(lambda: echo.apply_async(args=(1,))) == 0
    assert not Job.objects.exists()
    (headers,) = sent
    assert headers[KEY_HEADER] == echo.intent((1,)).key
    assert headers[UNWRITTEN_HEADER] is True


def test_a_fresh_claim_is_one_statement_and_a_replay_one(backend, broker_durability):
    """The claim of a key with no row is the ``claimed`` move from (none): one INSERT ...
    that returns the row (PostgreSQL: ON CONFLICT DO NOTHING; portable: one INSERT); the
    commit one more; a duplicate of the finished key finds it with its one insert try."""
    key = echo.intent((2,)).key
    by_connection = statements(lambda: echo.apply(args=(2,), headers=unwritten(key)).get())
    claim, commit = [routines.statement_of(sql) for sqls in by_connection.values()
                     for sql in sqls]
    assert claim.lstrip().upper().startswith(("INSERT", "WITH INS AS")), claim
    assert "finished_at" in commit
    assert count(lambda: echo.apply(args=(2,), headers=unwritten(key)).get()) == (
        1 if backend.__class__.__name__ == "PostgreSQLBackend" else 2)
    job = Job.objects.get(key=key)
    assert (job.state, job.attempt, job.args) == ("SUCCEEDED", 1, [2])


def test_a_fresh_claim_counts_one_statement(backend, broker_durability):
    """The claim alone, as the issue asks: one statement on every backend."""
    from celery_idem import claims

    intent = echo.intent((3,))
    won = []
    assert count(lambda: won.append(claims.acquire(
        intent, worker="w/1", task_id="t-3", lease_seconds=60, using="default",
        insert_first=True))) == 1
    outcome, claim = won[0]
    assert outcome.won and claim is not None and claim.attempt == 1


@shared_task(base=IdempotentTask, bind=True, idempotency_key="pick/{n}", name="tests.pick")
def pick(self, n, extra=0):
    return [n, extra]


def test_other_arguments_under_a_key_fail_at_the_worker_not_at_publish(
        backend, broker_durability, settings):
    """The producer cannot see the stored row: the publish with other arguments
    succeeds, and the worker raises KeyMismatch without running the body. (The default
    raises it to the producer.)"""
    key = pick.intent((1,)).key
    assert pick.apply(args=(1,), headers=unwritten(key)).get() == [1, 0]
    pick.apply_async(args=(1,), kwargs={"extra": 2})  # no error: nothing is read
    with pytest.raises(KeyMismatch):
        pick.apply(args=(1,), kwargs={"extra": 2}, headers=unwritten(key)).get()
    assert Job.objects.get(key=key).kwargs == {}
    settings.CELERY_IDEM_DURABILITY = "database"
    with pytest.raises(KeyMismatch):
        pick.apply_async(args=(1,), kwargs={"extra": 2})


def test_inside_a_transaction_the_message_leaves_on_commit_with_no_row(
        backend, broker_durability, sent):
    """Celery's delay_on_commit: no statement in the transaction, the message after the
    commit; a rollback sends nothing."""
    with pytest.raises(RuntimeError), transaction.atomic():
        assert count(lambda: echo.apply_async(args=(6,))) == 0
        raise RuntimeError
    assert sent == []
    with transaction.atomic():
        assert count(lambda: echo.apply_async(args=(7,))) == 0
        assert sent == []
    assert [h[KEY_HEADER] for h in sent] == [echo.intent((7,)).key]
    assert not Job.objects.exists()


def test_a_batch_is_just_publishing(backend, broker_durability, sent):
    """A batch and a group write nothing; every message leaves."""
    assert count(lambda: batching.publish_many(group(echo.s(n) for n in (8, 9, 10)))) == 0
    with batching.batch():
        echo.delay(11)
    assert sorted(h[KEY_HEADER] for h in sent) == sorted(
        echo.intent((n,)).key for n in (8, 9, 10, 11))
    assert not Job.objects.exists()


def test_the_default_still_writes_the_intent(backend, sent):
    """Without the setting, the publish writes its intent and the message says so."""
    assert count(lambda: echo.apply_async(args=(12,))) == 1
    (headers,) = sent
    assert UNWRITTEN_HEADER not in headers
    assert Job.objects.get(key=echo.intent((12,)).key).state == "PENDING"


def test_the_claims_row_keeps_the_routing_the_message_came_by(backend, broker_durability):
    """No intent kept the routing: the claim stores the message's delivery info, so a
    re-send of a released claim goes where the original went."""
    key = echo.intent((13,)).key
    echo.apply(args=(13,), headers=unwritten(key), exchange="ex", routing_key="rk").get()
    assert Job.objects.get(key=key).options == {"exchange": "ex", "routing_key": "rk"}
