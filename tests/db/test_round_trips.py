"""Database round trips per protocol path, counted (deterministic, unlike timings).

On PostgreSQL each step is one statement: publish 1, fresh run 2 (claim, commit), replay
of a finished key 1. The portable backend spends more statements; its counts are pinned
so a regression shows.
"""

from __future__ import annotations

import pytest
from celery import shared_task
from django.db import connection
from django.test.utils import CaptureQueriesContext

from celery_idem import IdempotentTask
from celery_idem.producer import KEY_HEADER as HEADER

pytestmark = pytest.mark.django_db(transaction=True)

#: Statements per path: (publish, fresh run, replay), per backend. The PostgreSQL
#: budget is at most 3 for a fresh run and 2 for a replay; it spends 2 and 1.
EXPECTED = {"native": (1, 2, 1), "generic": (1, 3, 2)}
#: Transaction control, which Django logs too; atomic=True adds BEGIN/COMMIT around the
#: body, which a body writing to the database needs anyway.
CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")


@shared_task(base=IdempotentTask, bind=True, idempotency_key="echo/{n}", name="tests.echo")
def echo(self, n):
    return n


@shared_task(base=IdempotentTask, bind=True, idempotency_key="aecho/{n}", atomic=True,
             name="tests.atomic_echo")
def atomic_echo(self, n):
    return n


def count(fn):
    with CaptureQueriesContext(connection) as captured:
        fn()
    statements = [q["sql"] for q in captured.captured_queries
                  if not q["sql"].lstrip().upper().startswith(CONTROL)]
    return len(statements)


@pytest.mark.parametrize("task", [echo, atomic_echo], ids=["default", "atomic"])
def test_statements_per_path(backend, backend_kind, task):
    """Publish, a fresh claim-to-commit, and a replay each cost their pinned count."""
    publish, fresh, replay = EXPECTED[backend_kind]
    key = task.intent((1,)).key
    assert count(lambda: task.apply_async(args=(1,))) == publish
    assert count(lambda: task.apply(args=(1,), headers={HEADER: key}).get()) == fresh
    assert count(lambda: task.apply(args=(1,), headers={HEADER: key}).get()) == replay

