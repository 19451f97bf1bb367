"""Issue 11 item 4, the prototype's statement count (bench/onestmt.py): what a worker's
message of ``bench.atomic`` (today's atomic path) and of ``bench.atomic1`` (the
one-statement prototype) send to PostgreSQL, BEGIN and COMMIT/ROLLBACK included, counted
with Django's query log like tests/db/test_round_trips.py. Each statement here is one
round trip (psycopg sends the BEGIN of a transaction as its own query)."""

from __future__ import annotations

import pytest
from celery.utils import uuid
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from celery_idem.backends import get_backend
from celery_idem.producer import KEY_HEADER

pytestmark = [
    pytest.mark.skipif(settings.DATABASE_KIND != "postgres",
                       reason="the prototype's statement is PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
]

CONTROL = ("BEGIN", "COMMIT", "ROLLBACK")


def _deliver(task, key: str):
    """Run ``task`` as a worker runs a message the library's producer sent (not eager,
    the key in its header); return the statements it sent, by kind."""
    intent = task.intent((key,))
    task.push_request(id=uuid(), headers={KEY_HEADER: intent.key}, is_eager=False,
                      called_directly=False, hostname="counter", retries=0)
    try:
        with CaptureQueriesContext(connection) as captured:
            task(key)
    finally:
        task.pop_request()
    sqls = [q["sql"].strip() for q in captured.captured_queries]
    return {"control": [s.split()[0].upper() for s in sqls if s.upper().startswith(CONTROL)],
            "statements": [s for s in sqls if not s.upper().startswith(CONTROL)]}


def _publish(task, key: str) -> None:
    get_backend("default").publish(task.intent((key,)), uuid(), timezone.now())


def test_today_atomic_and_the_one_statement_prototype_per_message():
    """Fresh key: today BEGIN, claim, body, commit, COMMIT (5 round trips); the prototype
    BEGIN, body, conditional commit, COMMIT (4). A duplicate of a finished key: today
    BEGIN, claim (lost: the row), COMMIT (3), the body does not run; the prototype runs
    the body and rolls it back: BEGIN, body, statement (lost), ROLLBACK (4)."""
    from bench.onestmt import bench_atomic1
    from django_app.effects.bench_tasks import bench_atomic
    from django_app.effects.models import Effect

    counts = {}
    for name, task in (("atomic", bench_atomic), ("atomic1", bench_atomic1)):
        key = f"count-{name}"
        _publish(task, key)
        fresh, replay = _deliver(task, key), _deliver(task, key)
        if name == "atomic1":  # the prototype's statement, not today's claim
            assert "won AS" in fresh["statements"][-1] and "won AS" in replay["statements"][-1]
        counts[name] = {"fresh": (fresh["control"], len(fresh["statements"])),
                        "replay": (replay["control"], len(replay["statements"]))}
        assert Effect.objects.filter(key=key).count() == 1
    assert counts == {
        # statements: the body's INSERT plus the library's claim and commit
        "atomic": {"fresh": (["BEGIN", "COMMIT"], 3), "replay": (["BEGIN", "COMMIT"], 1)},
        # the body's INSERT plus the one conditional statement, in both cases
        "atomic1": {"fresh": (["BEGIN", "COMMIT"], 2), "replay": (["BEGIN", "ROLLBACK"], 2)},
    }
