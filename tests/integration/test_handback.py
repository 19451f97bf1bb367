"""``on_stale_claim="uncertain"`` holds on every path that hands a lost claim back."""

from __future__ import annotations

import pytest

from celery_idem import InProgress
from celery_idem.models import Job, Transition
from celery_idem.recovery import sweep as reaper
from django_app.effects.models import Effect
from django_app.effects.path_tasks import uncertain_send

from .test_recovery import kill_child_of, later
from .workers import Worker, wait_until

#: How the broker delivers, requeues, loses or delays messages decides these: every broker
#: tier runs them (tests/run.py).
pytestmark = pytest.mark.delivery

TIMEOUT = 120


@pytest.fixture
def flags(tmp_path, broker_service, transactional_db):
    return tmp_path


def started(name: str) -> bool:
    return Effect.objects.filter(key=f"uncertain/{name}").exists()


def test_child_killed_after_the_effect_leaves_the_job_uncertain(durability, flags):
    """The worker-lost hook moves the claim to UNCERTAIN; the requeued message meets it
    and fails loudly (InProgress) instead of running the body again."""
    with Worker(concurrency=2) as w:
        sent = uncertain_send.delay("c", str(flags))
        wait_until(lambda: started("c"), TIMEOUT, what="the effect")
        kill_child_of(w, "uncertain/c", flags)
        (flags / "c").touch()
        # The requeued message is delivered again and refused, loudly: no second run.
        with pytest.raises(InProgress, match="UNCERTAIN"):
            sent.get(timeout=TIMEOUT)
    assert Effect.objects.filter(key="uncertain/c").count() == 1
    job = Job.objects.get(key="uncertain/c")
    assert job.state == "UNCERTAIN" and job.attempt == 1
    line = Transition.objects.get(job=job, event="uncertain")
    assert line.reason.startswith("worker lost")


def test_whole_worker_killed_then_recovery_leaves_the_job_uncertain(durability, flags):
    first = Worker(concurrency=2).start()
    try:
        uncertain_send.delay("w", str(flags))
        wait_until(lambda: started("w"), TIMEOUT, what="the effect")
    finally:
        first.kill()
    (flags / "w").touch()
    report = reaper.reap(now=later())  # no worker is alive: moving the clock claims nothing
    assert report.as_dict() == {"uncertain": {uncertain_send.name: 1}}
    assert Job.objects.get(key="uncertain/w").state == "UNCERTAIN"
    assert Effect.objects.filter(key="uncertain/w").count() == 1
