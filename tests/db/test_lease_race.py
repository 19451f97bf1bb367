"""Many OS processes race to acquire one lease name, round after round: each round
exactly one of them holds it, and its token is one more than the last round's."""

from __future__ import annotations

import multiprocessing
import queue
from collections import defaultdict

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from celery_idem.models import Lease

from .lease_contender import contend

PROCESSES = 8
#: SQLite serialises every writer through one file lock, so fewer rounds prove as much there.
ROUNDS = 60 if settings.DATABASE_KIND == "postgres" else 30
KINDS = ["native", "portable"] if settings.DATABASE_KIND == "postgres" else ["portable"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.django_db(transaction=True)
def test_processes_racing_for_one_lease_get_one_holder_per_round(kind):
    env = {"IDEM_DB_NAME": str(connection.settings_dict["NAME"]),
           "IDEM_DATABASE": settings.DATABASE_KIND,
           "DJANGO_SETTINGS_MODULE": "django_app.settings"}
    start = timezone.now().isoformat()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=contend, args=(env, kind, start, barrier, results, ROUNDS))
             for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    outcomes = []
    try:
        for _ in range(PROCESSES * ROUNDS):
            outcomes.append(results.get(timeout=120))
    except queue.Empty:
        pytest.fail(f"only {len(outcomes)} of {PROCESSES * ROUNDS} acquisitions reported")
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()

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
