"""Many OS processes claim the same key at the same moment: exactly one wins."""

from __future__ import annotations

from collections import Counter

import pytest
from django.conf import settings

from celery_idem.backends.values import Intent
from celery_idem.models import Job
from celery_idem.producer import write_intent

from .race_contender import contend
from .racing import race

PROCESSES = 16
#: SQLite serialises every writer through one file lock, so fewer rounds prove as much there.
ROUNDS = 200 if settings.DATABASE_KIND == "postgres" else 60


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("insert_first", [False, True], ids=["claim-first", "insert-first"])
def test_sixteen_processes_claiming_one_key_produce_one_winner_per_round(insert_first):
    """Every round one winner: half the rounds race to UPDATE a published intent, half to
    INSERT a missing one (200 rounds on PostgreSQL). ``insert-first``: every contender
    tries the INSERT first, as a worker does for a message published with
    CELERY_IDEM_DURABILITY = "broker" (no intent)."""
    for n in range(0, ROUNDS, 2):
        write_intent(Intent("race", f"race-{n}", "race", "fp", [n], {}, {}), f"pub-{n}")
    outcomes = race(contend, PROCESSES, ROUNDS, insert_first)

    winners = Counter(n for n, _, won in outcomes if won)
    assert sorted(winners) == list(range(ROUNDS))
    assert set(winners.values()) == {1}, "a round had more than one winner"
    assert len({pid for _, pid, _ in outcomes}) == PROCESSES
    assert set(Job.objects.filter(namespace="race").values_list("attempt", flat=True)) == {1}
    claimed = Job.objects.filter(namespace="race", state="RUNNING", started_at__isnull=False)
    assert claimed.count() == ROUNDS
