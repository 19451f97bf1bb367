"""CELERY_IDEM_WORKER_CONNECTIONS = "keep" on real prefork workers (PostgreSQL only).

A kept connection serves task after task; a time limit that interrupts a query, caught by
the body or not, or a hard limit that kills the child, never hands the next task a broken
connection. One pool child (-c 1), so "the next task" runs where the interrupted one did.
"""

from __future__ import annotations

import pytest
from celery.exceptions import TimeLimitExceeded
from django.conf import settings

from django_app.effects.conn_tasks import sleep_hard, sleep_soft, sleep_soft_raises, where

from .workers import Worker, purge_queue, worker_env

TIMEOUT = 60
INCLUDE = ("-I", "django_app.effects.conn_tasks")

pytestmark = pytest.mark.skipif(settings.DATABASE_KIND != "postgres",
                                reason="the connection policy matters for PostgreSQL sessions")


def _worker(policy: str) -> Worker:
    # A message an earlier test left queued (on RabbitMQ a stopped worker's unacked
    # messages come straight back) would run between two of ours on the one child: one of
    # an idempotent task whose intent the database flush removed waits (a Retry, not a
    # SUCCESS), so the policy rightly closes the session and the next task has a new one.
    purge_queue()
    return Worker(concurrency=1, extra_args=INCLUDE,
                  env=worker_env(IDEM_WORKER_CONNECTIONS=policy))


def _where() -> dict[str, int]:
    return where.delay().get(timeout=TIMEOUT)


def test_keep_serves_every_task_from_one_session(broker_service, transactional_db):
    with _worker("keep"):
        runs = [_where() for _ in range(4)]
    assert len({r["child"] for r in runs}) == 1
    assert len({r["backend"] for r in runs}) == 1, runs


@pytest.mark.skipif(settings.PGBOUNCER, reason="behind a pooler a new client connection "
                    "gets one of the pooler's server sessions, not a new one")
def test_celery_fixup_opens_a_session_per_task(broker_service, transactional_db):
    """The control: without the policy each task gets a new backend (Celery >= 5.6)."""
    with _worker("celery"):
        runs = [_where() for _ in range(3)]
    assert len({r["child"] for r in runs}) == 1
    assert len({r["backend"] for r in runs}) == 3, runs


def test_interrupted_queries_never_reach_the_next_task(broker_service, transactional_db):
    with _worker("keep"):
        kept = _where()
        # Soft limit, caught: the task SUCCEEDS with its query still in flight.
        caught = sleep_soft.delay(5).get(timeout=TIMEOUT)
        assert caught["interrupted"] == "soft"
        assert caught["backend"] == kept["backend"]
        after_caught = _where()
        assert after_caught["child"] == caught["child"]
        assert after_caught["backend"] != caught["backend"]

        # Soft limit, not caught: the task fails; the child lives on.
        failing = sleep_soft_raises.delay(5)
        with pytest.raises(Exception, match="SoftTimeLimitExceeded|TimeLimit"):
            failing.get(timeout=TIMEOUT)
        assert failing.state == "FAILURE"
        after_raise = _where()
        assert after_raise["child"] == after_caught["child"]
        assert after_raise["backend"] != after_caught["backend"]

        # Hard limit: the pool kills the child; the next task runs in its replacement.
        with pytest.raises(TimeLimitExceeded):
            sleep_hard.delay(5).get(timeout=TIMEOUT)
        after_hard = _where()
        assert after_hard["child"] != after_raise["child"]
        # And the new child keeps its session again: two tasks in a row on it share one.
        # (billiard may replace a child once more right after a hard kill, so a pair that
        # straddles a replacement is skipped, within a bounded number of tries.)
        for _ in range(5):
            first, second = _where(), _where()
            if first["child"] == second["child"]:
                break
        assert first["child"] == second["child"], (first, second)
        assert second["backend"] == first["backend"], (first, second)
