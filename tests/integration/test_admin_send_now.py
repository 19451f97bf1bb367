"""The admin's Send now with a real worker: a pending job whose message the broker lost
runs once, however often the operator sends it."""

from __future__ import annotations

import pytest

from celery_idem.models import Job
from django_app.effects.models import Effect
from django_app.effects.tasks import ship_order
from tests.db.admin_operator import act as act
from tests.db.admin_operator import login as login
from tests.db.admin_operator import messages

from .jobs import TIMEOUT, events, job
from .workers import Worker, purge_queue, wait_until

#: The broker loses the message and the operator's re-send delivers it: every broker tier.
pytestmark = pytest.mark.delivery


def handled(log: str) -> int:
    """How many ship_order messages the worker's log says it finished with."""
    return sum(1 for line in log.splitlines()
               if ".ship_order[" in line and " succeeded in " in line)


def test_a_lost_message_sent_now_twice_runs_once(broker_service, transactional_db, login,
                                                 act):
    """Published, lost by the broker, sent twice from the admin: two messages reach the
    worker, the effect happens once and the job succeeds at its first attempt."""
    ship_order.delay(3001)
    purge_queue()  # the broker loses it before any worker runs
    operator = login("retry_job")
    for n in (1, 2):
        response = act(operator, "send_now_selected", job("ship/3001"))
        assert messages(response)[-1] == "1 pending job was sent to its queue again: ship/3001."
        assert job("ship/3001").dispatch_count == n
    with Worker(concurrency=2) as worker:
        # Both messages handled: one ran the body, the other found the key claimed or
        # done and replayed its outcome.
        wait_until(lambda: handled(worker.log()) == 2, TIMEOUT, what="both messages handled")
    assert Effect.objects.filter(key="ship/3001").count() == 1
    assert job("ship/3001").attempt == 1
    assert events("ship/3001") == ["redispatched", "redispatched"]
    assert list(Job.objects.get(key="ship/3001").transitions.values_list("actor", flat=True)
                ) == ["op", "op"]
