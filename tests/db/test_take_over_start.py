"""A take-over keeps the start of the attempt it takes over, even when another take-over
of the same stale claim commits while it waits for the row.

On PostgreSQL the start is read from the statement's snapshot: a take-over that waited
for a concurrent one re-checks the row that one left, which may still look stale (a
lease already past, as here), and without its guard on the attempt it saw it would take
over the newer attempt while keeping the older one's start.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from celery_idem import claims
from celery_idem.backends import Claimant, ClaimOutcome, get_backend
from celery_idem.models import Transition
from tests.integration.workers import wait_until

from .lock_waits import POLL_SECONDS, ROW_LOCKING, lock_waiters

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.skipif(connection.vendor not in ROW_LOCKING,
                    reason="SQLite has one writer at a time: there is no row lock to observe")
def test_a_take_over_that_waited_for_another_keeps_the_start_of_the_attempt_it_took(
        make_intent):
    backend, first = get_backend("default"), timezone.now() - timedelta(minutes=5)
    intent = make_intent("stale")
    job_id = backend.publish(intent, "t-0", first).row.id
    backend.claim("claimed", intent, Claimant("w/1", "t-1", first, first + timedelta(seconds=60)))
    # The first take-over's own lease is past by the time the second one re-checks it.
    second = first + timedelta(minutes=2)
    outcome: list[ClaimOutcome] = []

    def take_over() -> None:  # its own session: Django's connections are per thread
        try:
            outcome.append(claims.acquire(intent, worker="w/3", task_id="t-3",
                                          lease_seconds=60, using="default")[0])
        finally:
            connections.close_all()

    with transaction.atomic():
        assert backend.claim("taken_over", intent, Claimant(
            "w/2", "t-2", second, second + timedelta(seconds=1))).won
        thread = threading.Thread(target=take_over)
        thread.start()
        wait_until(lambda: lock_waiters() == 1, 30, POLL_SECONDS,
                   what="the second take-over waiting for the row")
    thread.join(30)
    [won] = outcome
    assert won.won and won.row is not None and won.row.attempt == 3
    # Each take-over kept the start of the attempt before its own.
    assert list(Transition.objects.filter(job_id=job_id).order_by("id").values_list(
        "event", "attempt", "attempt_started_at")) == [("taken_over", 2, first),
                                                       ("taken_over", 3, second)]
