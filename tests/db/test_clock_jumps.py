"""The clock jumping backwards and forwards (docs/explanation/reliability.md, "Bad inputs").

Leases are written and compared in the clock of the process that acts
(``django.utils.timezone.now()``, passed to the database as a value), never the
database's. A clock that jumps forward makes a live lease look expired: it is taken
over early and the old holder is fenced out. A clock that jumps backwards makes leases
look longer (recovery waits longer), and a heartbeat under it writes a lease that ends
in the past: the claim is taken over and the holder fenced out. No live worker runs
here: every claimant is this process, its clock moved with freezegun.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from freezegun import freeze_time

from celery_idem import claims
from celery_idem.errors import ClaimLost
from celery_idem.models import Job
from celery_idem.recovery import sweep
from django_app.effects.tasks import ship_order

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)


def acquire(intent, task_id, clock=None):
    with freeze_time(clock or timezone.now()):
        return claims.acquire(intent, worker=task_id, task_id=task_id, lease_seconds=60,
                              using="default")


def test_a_clock_ahead_takes_over_a_live_claim_and_the_holder_is_fenced(backend, make_intent):
    """Jump forward: the second claimant's clock is an hour ahead, so the live lease looks
    expired; it takes over (attempt 2) and the first holder can neither heartbeat nor
    commit."""
    _, first = acquire(make_intent(), "task-1")
    _, second = acquire(make_intent(), "task-2", timezone.now() + HOUR)
    assert (first.attempt, second.attempt) == (1, 2)
    with pytest.raises(ClaimLost):
        first.heartbeat()
    assert not first.succeed("first")
    assert second.succeed("second")
    assert Job.objects.get(key="k1").result == "second"


def test_a_clock_behind_sees_a_live_lease_longer_and_recovery_waits(backend):
    """Jump backwards: an hour behind, a lease that expired two minutes ago still looks
    live: no take-over, no recovery; a claimant with the true clock takes it over."""
    intent = ship_order.intent((1,))
    now = timezone.now()
    acquire(intent, "task-1", now - timedelta(minutes=3))
    outcome, behind = acquire(intent, "task-2", now - HOUR)
    assert behind is None and outcome.row.attempt == 1
    assert sweep.reap(now=now - HOUR).as_dict() == {}
    assert Job.objects.get(key="ship/1").attempt == 1
    _, true_clock = acquire(intent, "task-3", now)
    assert true_clock is not None and true_clock.attempt == 2


def test_a_heartbeat_under_a_clock_behind_ends_the_lease_early_and_is_fenced(
        backend, make_intent):
    """The holder's clock jumps an hour back and it heartbeats: its lease now ends in the
    past, so a claimant with the true clock takes over at once; the holder is fenced."""
    _, holder = acquire(make_intent(), "task-1")
    with freeze_time(timezone.now() - HOUR):
        holder.heartbeat()
    assert Job.objects.get(key="k1").lease_expires_at < timezone.now()
    _, taker = acquire(make_intent(), "task-2")
    assert taker is not None and taker.attempt == 2
    assert not holder.succeed("stale holder")
    assert taker.succeed("taker")
    assert (Job.objects.get(key="k1").state, Job.objects.get(key="k1").result) == \
        ("SUCCEEDED", "taker")
