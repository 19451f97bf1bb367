"""The library leaves nothing on a PostgreSQL session unless the settings ask for it.

A transaction pooler (PgBouncer in ``pool_mode = transaction``) hands a server session to
another client after each transaction, so whatever a session keeps beyond a transaction
reaches a client that did not make it: a prepared statement (``prepared statement
"_pg3_0" already exists``), a ``SET``, an advisory lock, a temporary table, a LISTEN.
After every path the library's bookkeeping takes in a process (publishes outside and
inside a transaction, alone and in batches, claims, commits, failures, retries, steps,
heartbeats, atomic runs and their replays, a recovery pass), each session it used,
Django's and its own, carries what a fresh session of the same settings carries, and
nothing more. With ``CELERY_IDEM_PREPARED_STATEMENTS`` on, its statements are prepared,
and still nothing else is left. The claims and commits on the bookkeeping connection do
not wait for the WAL flush, per transaction, which a deferred trigger reads at each
commit.
"""

from __future__ import annotations

import pytest
from celery import shared_task
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from celery_idem import IdempotentTask, batch, claims
from celery_idem import connection as bookkeeping
from celery_idem.backends import Change, routines
from celery_idem.models import Job
from celery_idem.producer import KEY_HEADER
from celery_idem.recovery import reap
from celery_idem.states import STEP_COMPLETED, State
from tests.pgsession import fresh_state, session_state

pytestmark = [
    pytest.mark.skipif(settings.DATABASE_KIND != "postgres",
                       reason="session state is PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
]


@shared_task(base=IdempotentTask, bind=True, idempotency_key="sess/{n}", name="tests.sess")
def plain(self, n):
    return n


@shared_task(base=IdempotentTask, bind=True, idempotency_key="asess/{n}", atomic=True,
             name="tests.atomic_sess")
def atomic(self, n):
    return n


@shared_task(base=IdempotentTask, bind=True, idempotency_key="asess-fail/{n}", atomic=True,
             name="tests.atomic_sess_fails")
def atomic_fails(self, n):
    raise ValueError(n)


@pytest.fixture(autouse=True)
def _fresh_sessions():
    """Every session of the test opened under its settings, closed after it."""
    connection.close()
    bookkeeping.close_bookkeeping_connections()
    yield
    connection.close()
    bookkeeping.close_bookkeeping_connections()


def dedicated_claim(n: int, task_id: str) -> claims.Claim:
    intent = plain.intent((n,))
    _, claim = claims.acquire(intent, worker="h/1", task_id=task_id, lease_seconds=60,
                              using="default", dedicated=True)
    assert claim is not None
    bookkeeping.release_bookkeeping()
    return claim


def exercise() -> None:
    """Every path of the library's bookkeeping, twice over (a statement is prepared on its
    second use on Django's connection, when prepared statements are asked for)."""
    for n in (1, 2):
        plain.apply_async(args=(n,))  # the intent on the bookkeeping connection
        with transaction.atomic():
            plain.apply_async(args=(n + 10,))  # inside a transaction: the outbox
        with batch():  # a batch's intents in one statement, then its sent marks in one
            plain.apply_async(args=(n + 40,))
            plain.apply_async(args=(n + 42,))
        with transaction.atomic(), batch():
            plain.apply_async(args=(n + 50,))
            plain.apply_async(args=(n + 52,))
        claim = dedicated_claim(n, f"t-{n}")  # as a worker claims (not eager)
        claim.heartbeat()
        step = Change(claim.job_id, STEP_COMPLETED, State.RUNNING, attempt=claim.attempt,
                      worker=claim.worker, task_id=claim.task_id)
        claim.backend.save_step(step, "first", {"n": n}, timezone.now())
        assert claim.backend.read_step(claim.job_id, "first") == (True, {"n": n})
        assert claim.succeed({"n": n})
        dedicated_claim(n + 10, f"t-{n + 10}").fail(RuntimeError("boom"))
        dedicated_claim(n + 20, f"t-{n + 20}").schedule_retry(None, "again")
        key = atomic.intent((n,)).key
        atomic.apply_async(args=(n,))
        assert atomic.apply(args=(n,), headers={KEY_HEADER: key}).get() == n
        assert atomic.apply(args=(n,), headers={KEY_HEADER: key}).get() == n  # replay
        with pytest.raises(ValueError):
            atomic_fails.apply(args=(n,)).get()  # a rolled-back atomic body
        dedicated_claim(n + 30, f"t-{n + 30}")  # a claim whose worker is lost
    # The recovery pass: the lost claims past their lease, the retries past their
    # dispatch timeout: moved and re-sent.
    report = reap(now=timezone.now() + timezone.timedelta(days=1))
    assert report.total("released") + report.total("redispatched") > 0, str(report)
    assert Job.objects.filter(key__startswith="sess/3").exists()


def sessions() -> dict[str, object]:
    """Every session the test used: Django's, and each bookkeeping one opened."""
    used = {"django": connection}
    used.update({f"bookkeeping {i}": w for i, w in enumerate(bookkeeping._opened)})
    assert len(used) > 1
    return used


def test_the_library_leaves_nothing_on_the_sessions_it_uses():
    exercise()
    for name, wrapper in sessions().items():
        assert session_state(wrapper) == fresh_state(wrapper), name


def test_prepared_statements_when_asked_for_and_nothing_else(settings):
    settings.CELERY_IDEM_PREPARED_STATEMENTS = True
    exercise()
    for name, wrapper in sessions().items():
        state, fresh = session_state(wrapper), fresh_state(wrapper)
        prepared = state.pop("prepared statements")
        fresh.pop("prepared statements")
        assert state == fresh, name
        # On Django's session the library's statements only, from their second use (a
        # rolled-back atomic body dropped the earlier ones: psycopg follows a ROLLBACK with
        # DEALLOCATE ALL); on the bookkeeping ones every statement from its first (Django's
        # own time zone set_config at connect too), the claim among them.
        assert prepared, name
        if name == "django":
            assert all("celery_idem_" in text for text in prepared), prepared
        else:
            assert any("attempt + 1" in routines.statement_of(text) for text in prepared), (
                name, prepared)
