"""Bookkeeping on a dropped connection: the claim and the commit are tried again on a
fresh one; a commit that landed before the drop is recognised, not called late."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from celery_idem import claims
from celery_idem.models import Job, Transition
from celery_idem.producer import KEY_HEADER
from django_app.effects.models import Effect
from django_app.effects.tasks import ship_order

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(claims, "CLAIM_BACKOFF", (0.01, 0.01))
    monkeypatch.setattr(claims, "COMMIT_BACKOFF", (0.01, 0.01))


def run(task, *args):
    return task.apply(args=args, headers={KEY_HEADER: task.intent(args).key})


def drops_after(backend, monkeypatch, method, event=None, times=1):
    """``backend.method`` does its work, then its connection drops ``times`` times."""
    real, left = getattr(backend, method), [times]

    def flaky(*args, **kwargs):
        value = real(*args, **kwargs)
        change = args[0] if args else None
        if left[0] and (event is None or getattr(change, "event", None) == event):
            left[0] -= 1
            raise OperationalError("server closed the connection unexpectedly")
        return value

    monkeypatch.setattr(backend, method, flaky)


def test_a_commit_that_landed_before_the_drop_counts_as_done(backend, monkeypatch):
    drops_after(backend, monkeypatch, "apply", "succeeded")
    assert run(ship_order, 31).get() == {"shipped": 31, "attempt": 1}
    job = Job.objects.get(key="ship/31")
    assert job.state == "SUCCEEDED" and job.result == {"shipped": 31, "attempt": 1}
    events = list(Transition.objects.filter(job=job).values_list("event", flat=True))
    assert "late_finish" not in events and "failed" not in events
    assert Effect.objects.filter(key="ship/31").count() == 1


def test_a_claim_that_landed_before_the_drop_is_still_this_attempts(backend, monkeypatch):
    drops_after(backend, monkeypatch, "claim")
    assert run(ship_order, 32).get() == {"shipped": 32, "attempt": 1}
    assert Job.objects.get(key="ship/32").state == "SUCCEEDED"
    assert Effect.objects.filter(key="ship/32").count() == 1


def test_a_commit_that_did_not_land_is_tried_again(backend, monkeypatch):
    real = backend.apply
    left = [2]

    def down_twice(change, now, **options):
        if change.event == "succeeded" and left[0]:
            left[0] -= 1
            raise OperationalError("database is locked")
        return real(change, now, **options)

    monkeypatch.setattr(backend, "apply", down_twice)
    assert run(ship_order, 33).get() == {"shipped": 33, "attempt": 1}
    assert Job.objects.get(key="ship/33").state == "SUCCEEDED"


def test_a_database_that_stays_down_at_claim_still_fails_closed(backend, monkeypatch):
    from celery_idem import PersistenceError

    def down(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(backend, "claim", down)
    outcome = run(ship_order, 34)
    assert isinstance(outcome.result, PersistenceError)
    assert not Effect.objects.filter(key="ship/34").exists()


def test_an_atomic_commit_lost_with_its_connection_is_not_the_bodys_failure(monkeypatch):
    """Found by the chaos suite (a PostgreSQL restart): an atomic body returned, then its
    transaction's commit failed with the connection. The key was recorded FAILED with
    the OperationalError, though the body never failed; every duplicate replayed that
    failure. Now the outcome is unknown, as for any dropped bookkeeping: the message
    waits and comes back, and the key runs once."""
    from django.db import connection

    from celery_idem.backends import pipeline
    from celery_idem.errors import PersistenceError
    from django_app.effects.tasks import deduct_stock

    calls = []

    def dropped_at_first(real):
        def commit(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                connection.connection.rollback()  # the commit never lands
                raise OperationalError("server closed the connection unexpectedly")
            return real(*args, **kwargs)
        return commit

    # The first commit fails, wherever it is sent: Django's at the block's exit, or the
    # PostgreSQL backend's, pipelined with the commit move (backends.pipeline).
    monkeypatch.setattr(connection, "_commit", dropped_at_first(connection._commit))
    monkeypatch.setattr(pipeline, "execute_and_commit",
                        dropped_at_first(pipeline.execute_and_commit))
    with pytest.raises(PersistenceError):
        run(deduct_stock, 8, 9, 1).get()
    assert not Job.objects.filter(key="deduct/8/9", state="FAILED").exists()
    assert not Effect.objects.filter(key="deduct/8/9").exists()
    assert run(deduct_stock, 8, 9, 1).get()["deducted"] == 1
    assert Job.objects.get(key="deduct/8/9").state == "SUCCEEDED"
    assert Effect.objects.filter(key="deduct/8/9").count() == 1
