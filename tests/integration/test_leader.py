"""Two real workers contend for one shard's coordinator ticks (sent twice per cycle, as by
two beat instances): one holder runs them at a time; when it is SIGKILLed, the other
takes over once the lease expires, and a write with the old token is refused; a holder
stopped warmly releases its lease."""

from __future__ import annotations

from datetime import datetime

import pytest

from celery_idem.errors import LeaseLost
from celery_idem.models import Lease
from django_app.effects.models import Effect
from django_app.effects.tasks import coordinator_tick, fenced_effect

from .workers import Worker, wait_until

SHARD, NAME = "s1", "coord/s1"
TIMEOUT = 60


def runs() -> list[Effect]:
    return list(Effect.objects.filter(key=NAME).order_by("id"))


def skipped() -> int:
    return Lease.objects.filter(name=NAME).values_list("skipped_ticks", flat=True).first() or 0


def overlaps() -> int:
    return Effect.objects.filter(key=f"overlap/{SHARD}").count()


def beats(folder) -> None:
    """One schedule cycle of two beat instances: the same tick sent twice."""
    for _ in range(2):
        coordinator_tick.delay(SHARD, str(folder))


@pytest.fixture
def workers(tmp_path, broker_service, transactional_db):
    pair = [Worker(concurrency=1).start(), Worker(concurrency=1).start()]
    yield pair
    for w in pair:
        w.stop()


def test_one_holder_at_a_time_and_takeover_after_the_holder_is_killed(workers, tmp_path):
    # Many cycles: every tick either runs on the holder or is skipped and counted.
    cycles = 15
    for _ in range(cycles):
        beats(tmp_path)
    wait_until(lambda: len(runs()) + skipped() + overlaps() >= 2 * cycles, TIMEOUT,
               what="every tick")
    assert overlaps() == 0, "two bodies of the shard ran at once"
    before = runs()
    assert len(before) + skipped() == 2 * cycles
    assert skipped() > 0, "the other worker never met the held lease"
    by_token: dict[int, set[int]] = {}
    for run in before:
        by_token.setdefault(run.attempt, set()).add(run.pid)
    assert all(len(pids) == 1 for pids in by_token.values()), by_token
    assert [r.attempt for r in before] == sorted(r.attempt for r in before)
    assert max(len([r for r in before if r.attempt == t]) for t in by_token) > 1, \
        "the holder did not keep its lease across ticks"

    # SIGKILL the worker that holds the shard: the other takes over after the lease.
    lease = Lease.objects.get(name=NAME)
    holder = next(w for w in workers if lease.holder.startswith(f"{w.name}@"))
    survivor = next(w for w in workers if w is not holder)
    holder.kill()
    old = Lease.objects.get(name=NAME)  # final now: nothing renews it any more

    def taken_over() -> list[Effect]:
        beats(tmp_path)
        return [r for r in runs() if r.attempt > old.token]
    new = wait_until(taken_over, TIMEOUT, interval=0.5, what="the takeover")[0]
    assert new.attempt == old.token + 1
    assert new.pid in survivor.children()
    assert new.value["holder"].startswith(f"{survivor.name}@")
    assert datetime.fromisoformat(new.value["at"]) >= old.expires_at
    assert Lease.objects.get(name=NAME).holder.startswith(f"{survivor.name}@")

    # The killed holder's token is fenced out: its late write does not land.
    with pytest.raises(LeaseLost, match="fenced out"):
        fenced_effect(NAME, old.token, phase="zombie")
    assert not Effect.objects.filter(key=NAME, value__phase="zombie").exists()
    assert overlaps() == 0, "two bodies of the shard ran at once"

    # A warm shutdown hands the shard over at once instead of leaving it for the lease.
    held = Lease.objects.get(name=NAME)
    assert held.is_live()
    survivor.stop()
    released = Lease.objects.get(name=NAME)
    assert released.token == held.token
    assert not released.is_live(), "the stopped holder kept its lease"
