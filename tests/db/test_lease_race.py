"""Many OS processes race to acquire one lease name, round after round: each round
exactly one of them holds it, and its token is one more than the last round's."""

from __future__ import annotations

from collections import defaultdict

import pytest
from django.conf import settings
from django.utils import timezone

from celery_idem.models import Lease

from .lease_contender import contend
from .racing import race

PROCESSES = 8
#: SQLite serialises every writer through one file lock, so fewer rounds prove as much there.
ROUNDS = 60 if settings.DATABASE_KIND == "postgres" else 30
KINDS = ["native", "portable"] if settings.DATABASE_KIND == "postgres" else ["portable"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.django_db(transaction=True)
def test_processes_racing_for_one_lease_get_one_holder_per_round(kind):
    start = timezone.now().isoformat()
    outcomes = race(contend, PROCESSES, ROUNDS, kind, start, timeout=120)

    holders = defaultdict(list)
    for n, pid, token in outcomes:
        if token is not None:
            holders[n].append((pid, token))
    assert sorted(holders) == list(range(ROUNDS)), "a round had no holder"
    assert all(len(h) == 1 for h in holders.values()), "a round had more than one holder"
    assert [holders[n][0][1] for n in range(ROUNDS)] == list(range(1, ROUNDS + 1))
    assert len({pid for _, pid, _ in outcomes}) == PROCESSES
    assert len({h[0][0] for h in holders.values()}) > 1, "one process won every round"
    assert Lease.objects.get(name="race").token == ROUNDS
