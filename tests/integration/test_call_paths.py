"""replace, map, starmap and chunks on a real worker, each sent three times: each key's
effect once, every caller gets the same value."""

from __future__ import annotations

import pytest
from celery import chain

from celery_idem.models import Job, Transition
from django_app.effects.models import Effect
from django_app.effects.path_tasks import (
    item,
    replaced_atomic,
    replaced_body,
    replaced_by_failure,
)

TIMEOUT = 120


def test_replace_runs_the_body_and_the_replacement_once_for_every_caller(worker):
    """Three messages of one key: the body replaces itself once (the replacement holds
    the claim for a moment, so duplicates meet it handed over), all three get 2 * n."""
    results = [replaced_body.delay(21, hold=1.0) for _ in range(3)]
    assert [r.get(timeout=TIMEOUT) for r in results] == [42, 42, 42]
    assert Effect.objects.filter(key="replace/21").count() == 1
    assert Effect.objects.filter(key="replacement/21").count() == 1
    job = Job.objects.get(key="replace/21")
    assert job.state == "SUCCEEDED" and job.result == 42 and job.attempt == 1
    events = list(Transition.objects.filter(job=job).values_list("event", flat=True))
    assert events[0] == "replaced" and "released" not in events


def test_a_replaced_key_replays_for_a_later_caller_without_running_the_body_again(worker):
    """The claim stays with the replacement (no release when the body's Ignore reaches
    the runner), so a caller after it finished replays its result."""
    assert replaced_body.delay(31).get(timeout=TIMEOUT) == 62
    assert replaced_body.delay(31).get(timeout=TIMEOUT) == 62
    job = Job.objects.get(key="replace/31")
    assert job.state == "SUCCEEDED" and job.attempt == 1
    events = list(Transition.objects.filter(job=job).values_list("event", flat=True))
    assert events == ["replaced"]
    assert Effect.objects.filter(key="replace/31").count() == 1
    assert Effect.objects.filter(key="replacement/31").count() == 1


def test_a_failed_replacement_fails_the_key_for_every_caller(worker):
    first = replaced_by_failure.delay(3)
    with pytest.raises(ValueError) as failed:
        first.get(timeout=TIMEOUT)
    # The duplicate's worker raises the stored failure as a ValueError too: Celery's
    # result backend hands its caller the same type and arguments.
    with pytest.raises(ValueError) as replayed:
        replaced_by_failure.delay(3).get(timeout=TIMEOUT)
    assert replayed.value.args == failed.value.args
    assert Job.objects.get(key="replace-fail/3").state == "FAILED"
    assert Effect.objects.filter(key="replacement-fail/3").count() == 1
    assert Effect.objects.filter(key="replace-fail/3").count() == 1


@pytest.mark.parametrize("kind", ["map", "starmap", "chunks"])
def test_builtin_maps_claim_each_item_once(worker, kind):
    base = {"map": 100, "starmap": 200, "chunks": 300}[kind]
    xs = [base + i for i in range(4)]

    def send():
        if kind == "map":
            return item.map(xs).delay()
        if kind == "starmap":
            return item.starmap([(x, 1) for x in xs]).delay()
        return item.chunks([(x, 1) for x in xs], 2).group().delay()

    results = [send() for _ in range(3)]
    values = [r.get(timeout=TIMEOUT) for r in results]
    assert values[0] == values[1] == values[2]
    for x in xs:
        assert Effect.objects.filter(key=f"item/{x}").count() == 1
        assert Job.objects.get(key=f"item/{x}").state == "SUCCEEDED"


def test_atomic_replace_commits_the_hand_over_with_the_bodys_writes(worker):
    results = [replaced_atomic.delay(5) for _ in range(3)]
    assert [r.get(timeout=TIMEOUT) for r in results] == [10, 10, 10]
    assert Effect.objects.filter(key="replace-atomic/5").count() == 1
    assert Effect.objects.filter(key="replacement-atomic/5").count() == 1
    assert Job.objects.get(key="replace-atomic/5").state == "SUCCEEDED"


def test_a_replaced_task_inside_a_chain_passes_its_result_on(worker):
    """Celery appends the rest of the chain after the replacement (and its last step)."""
    assert chain(replaced_body.si(6), item.s()).apply_async().get(timeout=TIMEOUT) == 12
    assert Job.objects.get(key="replace/6").result == 12
    assert Effect.objects.filter(key="item/12").count() == 1
