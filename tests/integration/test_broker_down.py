"""A publish while the broker is down, with a Redis of the test's own stopped for real: a
call that returns runs once, a call that raises never runs, and the row never says a
message was sent before it was (docs/reliability.md, the guarantee table)."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from celery_idem import batch
from celery_idem.conf import settings as idem_settings
from celery_idem.models import Job, Transition
from celery_idem.recovery import sweep as reaper
from django_app.celery import app
from django_app.effects.models import Effect
from django_app.effects.tasks import ship_order
from tests.chaos.servers import Redis, free_port
from tests.conftest import IN_CI

from .workers import Worker, wait_until, worker_env

pytestmark = pytest.mark.delivery

TIMEOUT = 90


@pytest.fixture
def own_broker(tmp_path, broker_service, transactional_db) -> Iterator[Redis]:
    """A Redis of this test's own as this process's broker (results stay where the run
    keeps them); the workers the test starts use it too (``broker_env``)."""
    if shutil.which("redis-server") is None:
        message = "redis-server is not installed: the test starts a Redis of its own"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    # A port no earlier test used: kombu keeps a producer pool per broker URL.
    server = Redis(tmp_path / "redis", free_port(6500 + secrets.randbelow(2000))).start()
    conf = app.conf
    saved = (conf.broker_url, conf.broker_transport, conf.broker_transport_options,
             app._pool, app.amqp._producer_pool)
    conf.broker_url = f"redis://127.0.0.1:{server.port}/0"
    # The SQLite tier's broker is the filesystem transport, named apart from the URL.
    conf.broker_transport, conf.broker_transport_options = None, {}
    app._pool = app.amqp._producer_pool = None  # built again on the new broker
    try:
        yield server
    finally:
        (conf.broker_url, conf.broker_transport, conf.broker_transport_options,
         app._pool, app.amqp._producer_pool) = saved
        server.stop()


def broker_env(server: Redis) -> dict[str, str]:
    return worker_env(IDEM_BROKER=f"redis://127.0.0.1:{server.port}/0")


def recovery_pass(**later: float) -> reaper.Report:
    """A recovery pass with its clock moved on by ``later`` (timedelta's keywords)."""
    return reaper.reap(now=timezone.now() + timedelta(**later))


def after_never_sent_timeout() -> reaper.Report:
    return recovery_pass(seconds=float(idem_settings.NEVER_SENT_TIMEOUT) + 1)


def history(key: str) -> list[str]:
    return list(Transition.objects.filter(job__key=key).order_by("id")
                .values_list("event", flat=True))


def test_a_publish_the_broker_missed_returns_and_runs_once(durability, own_broker):
    """Broker stopped: delay() returns; the row says never sent (no sent time, the failed
    send in its history); recovery sends it after the never-sent timeout, not before;
    the job runs once. Broker durability writes nothing, so the call raises and the job
    never runs."""
    own_broker.stop()
    if durability == "broker":
        with pytest.raises(Exception) as raised:
            ship_order.delay(3601)
        assert "OperationalError" in type(raised.value).__name__
        own_broker.start()
        with Worker(concurrency=1, env=broker_env(own_broker)):
            ship_order.delay(3602).get(timeout=TIMEOUT)  # the worker took what was queued
        assert not Job.objects.filter(key="ship/3601").exists()
        assert not Effect.objects.filter(key="ship/3601").exists()
        return

    result = ship_order.delay(3601)
    job = Job.objects.get(key="ship/3601")
    assert (job.state, job.sent_at, job.dispatch_count) == ("PENDING", None, 0)
    assert history("ship/3601") == ["send_failed"]
    assert job.task_id == result.id
    # Not sent again before the never-sent timeout (the broker is still down anyway).
    assert recovery_pass().total("redispatched") == 0

    own_broker.start()
    with Worker(concurrency=1, env=broker_env(own_broker)):
        report = after_never_sent_timeout()
        assert report.total("redispatched") == 1, report
        # The caller's AsyncResult gets the result: the message went under its task id.
        assert result.get(timeout=TIMEOUT) == {"shipped": 3601, "attempt": 1}
        assert after_never_sent_timeout().total("redispatched") == 0
    job.refresh_from_db()
    assert job.state == "SUCCEEDED" and job.sent_at is not None
    assert Effect.objects.filter(key="ship/3601").count() == 1


def test_a_send_task_the_broker_missed_returns_and_runs_once(own_broker):
    """app.send_task(name) of a task known here (its intent written by the publish hook),
    broker stopped: the call returns, the row says never sent, recovery sends it under
    the caller's task id, it runs once."""
    own_broker.stop()
    result = app.send_task(ship_order.name, args=[3631])
    job = Job.objects.get(key="ship/3631")
    assert (job.sent_at, job.task_id) == (None, result.id)
    own_broker.start()
    with Worker(concurrency=1, env=broker_env(own_broker)):
        assert after_never_sent_timeout().total("redispatched") == 1
        assert result.get(timeout=TIMEOUT) == {"shipped": 3631, "attempt": 1}
    assert Effect.objects.filter(key="ship/3631").count() == 1


def test_a_batch_the_broker_missed_returns_and_each_job_runs_once(own_broker):
    """A batch published while the broker is down: the block returns, every row says
    never sent, recovery sends each, each runs once."""
    own_broker.stop()
    with batch():
        for n in (3611, 3612, 3613):
            ship_order.delay(n)
    keys = ["ship/3611", "ship/3612", "ship/3613"]
    assert sorted(Job.objects.filter(key__in=keys, sent_at__isnull=True)
                  .values_list("key", flat=True)) == keys

    own_broker.start()
    with Worker(concurrency=1, env=broker_env(own_broker)):
        assert after_never_sent_timeout().total("redispatched") == 3
        wait_until(lambda: Job.objects.filter(key__in=keys, state="SUCCEEDED").count() == 3,
                   TIMEOUT, what="the batch's jobs")
    assert sorted(Effect.objects.values_list("key", flat=True)) == keys


def test_a_resend_the_broker_missed_says_not_sent_and_keeps_its_budget(own_broker):
    """Recovery re-sends a lost message while the broker is down: the row says never
    sent and the dispatch count is given back (an outage uses up no re-dispatch), the
    pass stops trying after the first failure; with the broker back a pass sends it and
    it runs once."""
    ship_order.delay(3621)  # sent: the broker then loses it (a restart without persistence)
    ship_order.delay(3622)
    own_broker.stop()
    wait = float(idem_settings.DISPATCH_TIMEOUT) + 1
    report = recovery_pass(seconds=wait)
    assert report.total("send_failed") == 2, report
    keys = ["ship/3621", "ship/3622"]
    rows = Job.objects.filter(key__in=keys).order_by("key")
    assert [(j.sent_at, j.dispatch_count) for j in rows] == [(None, 0), (None, 0)]
    assert history("ship/3621") == ["redispatched", "send_failed"]

    own_broker.start()
    with Worker(concurrency=1, env=broker_env(own_broker)):
        assert recovery_pass(seconds=wait).total("redispatched") == 2
        wait_until(lambda: Job.objects.filter(key__in=keys, state="SUCCEEDED").count() == 2,
                   TIMEOUT, what="the re-sent jobs")
    assert Effect.objects.filter(key__in=keys).count() == 2


def test_only_the_brokers_answer_can_refuse_a_message(own_broker):
    """A publish on a producer whose channel a broker restart closed raises
    AttributeError from kombu: the client's fault, not an answer about the message, so
    the job is accepted (unsent.after_publish_error) rather than failed for good as
    refused. The transport's connection errors and kombu's own are answers."""
    import redis.exceptions
    from kombu.exceptions import OperationalError

    from celery_idem import unsent

    with app.connection_for_write() as connection:
        producer = connection.Producer()
        producer.channel.close()
        with pytest.raises(AttributeError) as raised:
            producer.publish({}, routing_key="nowhere", retry=True)
    assert not unsent.answered(raised.value, app)
    assert unsent.answered(OperationalError("refused"), app)
    assert unsent.answered(redis.exceptions.ConnectionError("closed"), app)
