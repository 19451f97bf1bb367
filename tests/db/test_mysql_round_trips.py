"""Round trips per protocol path on MySQL/MariaDB, counted by the server: the session's
``Questions`` status counts every statement the client sent, the transaction control
that Django's query log leaves out (``SET autocommit``, COMMIT, savepoints) included.

The portable backend sends a write with no history line as its one statement, without
``transaction.atomic`` around it (three more round trips on MySQL: backends/generic.py).
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from celery_idem import batch
from celery_idem.producer import KEY_HEADER as HEADER

from .test_round_trips import atomic_echo, echo

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "mysql",
                       reason="the Questions status counter is MySQL/MariaDB's"),
]

#: Round trips per path: publish, fresh run, replay. A fresh default run is the claim's
#: UPDATE, the read of its attempt and the commit's UPDATE; a replay the claim's UPDATE
#: that matches nothing and the read of the finished row. An atomic body's block adds
#: SET autocommit (twice) and its COMMIT.
EXPECTED = {"default": (1, 3, 2), "atomic": (1, 6, 5)}


def questions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Questions'")
        return int(cursor.fetchone()[1])


def round_trips(fn) -> int:
    """The statements ``fn`` sends on Django's connection (the counter's own read, which
    it also counts, taken off)."""
    first = questions()
    before = questions()
    fn()
    return questions() - before - (before - first)


@pytest.mark.parametrize("task", [echo, atomic_echo], ids=["default", "atomic"])
def test_round_trips_per_path(backend, task):
    """Publish, a fresh claim-to-commit and a replay each cost their pinned count."""
    publish, fresh, replay = EXPECTED["atomic" if task.atomic else "default"]
    key = task.intent((1,)).key
    assert round_trips(lambda: task.apply_async(args=(1,))) == publish
    assert round_trips(lambda: task.apply(args=(1,), headers={HEADER: key}).get()) == fresh
    assert round_trips(lambda: task.apply(args=(1,), headers={HEADER: key}).get()) == replay


def test_inside_the_callers_transaction_a_conflict_rolls_back_its_savepoint_alone(backend):
    """In the caller's transaction the intent keeps its savepoints: the producer's (bad
    input) and the INSERT's own, so that a key that exists fails that savepoint, the row
    is read, and the caller's transaction goes on."""
    with transaction.atomic():
        # SAVEPOINT twice, the INSERT, RELEASE twice
        assert round_trips(lambda: echo.apply_async(args=(5,))) == 5
        # ... the INSERT fails: ROLLBACK TO and RELEASE of its savepoint, the read
        assert round_trips(lambda: echo.apply_async(args=(5,))) == 7
        assert not connection.needs_rollback
        assert round_trips(lambda: echo.apply_async(args=(6,))) == 5


#: A batch outside a transaction: MySQL's backend sends its multi-row INSERT and the read
#: of the keys' rows each alone; the portable one wraps the two in a transaction (SET
#: autocommit twice and COMMIT).
BATCH = {"native": 2, "generic": 5}


def test_a_batch_outside_a_transaction_is_its_insert_and_one_read(backend, backend_kind):
    """The batch's intents in one multi-row INSERT, then one read of its keys' rows."""
    def batched():
        with batch():
            for i in range(10, 15):
                echo.apply_async(args=(i,))

    assert round_trips(batched) == BATCH[backend_kind]
