"""replace, map, starmap and chunks in-process (eager): each key's effect once."""

from __future__ import annotations

import pytest

from celery_idem.models import Job
from django_app.effects.models import Effect
from django_app.effects.path_tasks import item, replaced_body

pytestmark = pytest.mark.django_db(transaction=True)


def test_eager_replace_returns_the_replacements_result_and_runs_once(backend):
    assert replaced_body.apply(args=(4,)).get() == 8
    assert replaced_body.apply(args=(4,)).get() == 8
    assert Effect.objects.filter(key="replace/4").count() == 1
    assert Effect.objects.filter(key="replacement/4").count() == 1
    assert Job.objects.get(key="replace/4").state == "SUCCEEDED"


@pytest.mark.parametrize("make", [
    lambda: item.map([1, 2, 3]),
    lambda: item.starmap([(1, 0), (2, 0), (3, 0)]),
    lambda: item.chunks([(1,), (2,), (3,)], 2).group(),
])
def test_each_item_of_a_builtin_map_claims_its_key(backend, make):
    first, second = (make().apply().get() for _ in range(2))
    assert first == second
    for x in (1, 2, 3):
        assert Effect.objects.filter(key=f"item/{x}").count() == 1
        assert Job.objects.get(key=f"item/{x}").state == "SUCCEEDED"


def test_a_plain_direct_call_still_claims_nothing(backend):
    assert item(5) == 5
    assert not Job.objects.exists()
