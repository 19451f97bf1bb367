"""Issue 11 item 4, the prototype's cost per message (bench/onestmt.py): what a worker's
message of ``bench.atomic`` (today's atomic path) and of ``bench.atomic1`` (the
one-statement prototype) sends to PostgreSQL: its statements and transaction control in
Django's query log, and its round trips in the libpq trace (psycopg sends a
transaction's BEGIN as a query of its own; today's commit move and COMMIT share one,
``celery_idem.backends.pipeline``)."""

from __future__ import annotations

import pytest
from celery.utils import uuid
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from celery_idem.backends import get_backend
from celery_idem.producer import KEY_HEADER
from tests.pgtrace import round_trips

pytestmark = [
    pytest.mark.skipif(settings.DATABASE_KIND != "postgres",
                       reason="the prototype's statement is PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
]

CONTROL = ("BEGIN", "COMMIT", "ROLLBACK")


def _deliver(task, key: str):
    """Run ``task`` as a worker runs a message the library's producer sent (not eager,
    the key in its header); return the statements it sent, by kind, and its round trips."""
    intent = task.intent((key,))
    task.push_request(id=uuid(), headers={KEY_HEADER: intent.key}, is_eager=False,
                      called_directly=False, hostname="counter", retries=0)
    trips = []
    try:
        with CaptureQueriesContext(connection) as captured:
            trips.append(round_trips(connection, lambda: task(key)))
    finally:
        task.pop_request()
    sqls = [q["sql"].strip() for q in captured.captured_queries]
    return {"control": [s.split()[0].upper() for s in sqls if s.upper().startswith(CONTROL)],
            "statements": [s for s in sqls if not s.upper().startswith(CONTROL)],
            "round_trips": trips[0]}


def _publish(task, key: str) -> None:
    get_backend("default").publish(task.intent((key,)), uuid(), timezone.now())


@pytest.mark.parametrize("prepared", [False, True], ids=["unprepared", "prepared"])
def test_today_atomic_and_the_one_statement_prototype_per_message(settings, prepared):
    """Fresh key: today BEGIN, claim, body, then the commit move with COMMIT (4 round
    trips); the prototype BEGIN, body, conditional commit, COMMIT (4). A duplicate of a
    finished key: today BEGIN, claim (lost: the row), COMMIT (3), the body does not run;
    the prototype runs the body and rolls it back: BEGIN, body, statement (lost), ROLLBACK
    (4 statements), 4 round trips; with prepared statements (CELERY_IDEM_PREPARED_STATEMENTS)
    6: psycopg drops every prepared statement of the session at a ROLLBACK
    (``DEALLOCATE ALL``, one more), so the prototype's statement is prepared again first
    (one more). Counted once every statement is prepared (psycopg spends one more round
    trip on a statement's first prepared use in a session)."""
    from bench.onestmt import bench_atomic1
    from django_app.effects.bench_tasks import bench_atomic

    from django_app.effects.models import Effect

    settings.CELERY_IDEM_PREPARED_STATEMENTS = prepared
    connection.close()  # a session under the setting
    counts = {}
    for name, task in (("atomic", bench_atomic), ("atomic1", bench_atomic1)):
        for warm in (f"warm1-{name}", f"warm2-{name}"):
            _publish(task, warm)
            _deliver(task, warm), _deliver(task, warm)
        key = f"count-{name}"
        _publish(task, key)
        fresh, replay = _deliver(task, key), _deliver(task, key)
        if name == "atomic1":  # the prototype's statement, not today's claim
            assert "won AS" in fresh["statements"][-1] and "won AS" in replay["statements"][-1]
        counts[name] = {
            "fresh": (fresh["control"], len(fresh["statements"]), fresh["round_trips"]),
            "replay": (replay["control"], len(replay["statements"]), replay["round_trips"])}
        assert Effect.objects.filter(key=key).count() == 1
    assert counts == {
        # statements: the body's INSERT plus the library's claim and commit
        "atomic": {"fresh": (["BEGIN", "COMMIT"], 3, 4), "replay": (["BEGIN", "COMMIT"], 1, 3)},
        # the body's INSERT plus the one conditional statement, in both cases
        "atomic1": {"fresh": (["BEGIN", "COMMIT"], 2, 4),
                    "replay": (["BEGIN", "ROLLBACK"], 2, 6 if prepared else 4)},
    }
    connection.close()
