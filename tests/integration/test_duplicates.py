"""The same key published several times to real workers runs its body once, on every
worker pool of the tier (the ``pools`` marker, tests/integration/conftest.py), with
each durability (``durability``: the broker's on prefork, where a claim inserts the row)."""

from __future__ import annotations

import pytest
from celery import chain

from celery_idem.keys import KEY_HEADER
from celery_idem.models import Job, Transition
from django_app.effects.models import Effect
from django_app.effects.tasks import deduct_stock, plain_effect, ship_order

from .workers import wait_until

RESULT_TIMEOUT = 120


@pytest.mark.pools
def test_same_key_five_times_runs_once_and_every_caller_gets_the_result(durability, worker):
    """Five publishes of one key: one effect, five equal results, one attempt; the
    duplicates replayed (or waited, then replayed) without writing a history row."""
    results = [ship_order.delay(42, hold=0.5) for _ in range(5)]
    values = [r.get(timeout=RESULT_TIMEOUT) for r in results]

    assert values == [{"shipped": 42, "attempt": 1}] * 5
    assert Effect.objects.filter(key="ship/42").count() == 1
    job = Job.objects.get(key="ship/42")
    assert (job.state, job.attempt) == ("SUCCEEDED", 1)
    assert job.started_at is not None and job.finished_at is not None
    assert not Transition.objects.filter(job=job).exists()
    # An intent keeps the message's envelope; broker durability wrote none: the worker's
    # claim inserted the row.
    assert (job.message is None) is (durability == "broker")


@pytest.mark.pools
def test_atomic_task_published_five_times_writes_its_effect_once(durability, worker):
    """atomic=True: duplicates serialise on the claim and replay the one result."""
    results = [deduct_stock.delay(7, 3, 2, hold=0.3) for _ in range(5)]
    values = [r.get(timeout=RESULT_TIMEOUT) for r in results]

    assert values == [{"deducted": 2, "attempt": 1}] * 5
    assert Effect.objects.filter(key="deduct/7/3").count() == 1
    job = Job.objects.get(key="deduct/7/3")
    assert (job.state, job.attempt) == ("SUCCEEDED", 1)
    assert not Transition.objects.filter(job=job).exists()


@pytest.mark.pools
def test_a_finished_key_published_again_replays_its_result(durability, worker):
    """Publishes after the key finished get the stored value; the body does not run again."""
    first = ship_order.delay(43).get(timeout=RESULT_TIMEOUT)
    again = [ship_order.delay(43) for _ in range(3)]

    assert [r.get(timeout=RESULT_TIMEOUT) for r in again] == [first] * 3
    assert first == {"shipped": 43, "attempt": 1}
    assert Effect.objects.filter(key="ship/43").count() == 1
    job = Job.objects.get(key="ship/43")
    assert (job.state, job.attempt) == ("SUCCEEDED", 1)  # claimed once: attempt 1
    assert not Transition.objects.filter(job=job).exists()  # the replays only read


def test_a_finished_key_published_again_unread_sends_nothing(durability, worker, sent):
    """A finished key published again with its result ignored and no canvas: nothing
    would see its replay, so no message leaves (broker durability reads no row at
    publish: it leaves, and its worker replays). As the first step of a chain it leaves,
    and the worker hands the stored result on: the next step runs."""
    ship_order.delay(45).get(timeout=RESULT_TIMEOUT)
    sent.clear()
    ship_order.apply_async((45,), ignore_result=True)
    chain(ship_order.si(45).set(ignore_result=True), plain_effect.si("after/45")).delay()

    wait_until(lambda: Effect.objects.filter(key="after/45").exists(), RESULT_TIMEOUT,
               what="the chain's next step")
    assert [h[KEY_HEADER] for h in sent if KEY_HEADER in h] == (
        ["ship/45"] if durability == "database" else ["ship/45", "ship/45"])
    assert Effect.objects.filter(key="ship/45").count() == 1
    job = Job.objects.get(key="ship/45")
    assert (job.state, job.attempt) == ("SUCCEEDED", 1)


def test_wait_until_helper_times_out():
    """The polling helper raises instead of waiting forever."""
    with pytest.raises(AssertionError, match="timed out"):
        wait_until(lambda: False, timeout=0.3, what="nothing")
