"""Publishing inside ``transaction.atomic()`` (issue 13): the intent is written in the
transaction and the message leaves on commit. A rollback leaves no job, no message and
no effect; a producer killed between the commit and the send loses nothing; a message
whose intent rolled back is never run."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db import connection, transaction
from django.test import override_settings

from celery_idem.models import Job
from celery_idem.recovery import sweep as reaper
from django_app.celery import app
from django_app.effects.models import Effect
from django_app.effects.tasks import ship_order
from tests.db.lock_waits import POLL_SECONDS, lock_waiters

from .workers import ROOT, Worker, wait_until, worker_env

#: How the broker delivers, requeues, loses or delays messages decides these: every broker
#: tier runs them (tests/run.py).
pytestmark = pytest.mark.delivery

TIMEOUT = 90


class Rollback(Exception):
    pass


def succeeded(key: str) -> bool:
    return Job.objects.filter(key=key, state="SUCCEEDED").exists()


def barrier(n: int) -> None:
    """Publish a job after the ones under test and wait for it: the worker has taken
    every message sent before it (one pool process, prefetch 1: first in, first out)."""
    ship_order.delay(n)
    wait_until(lambda: succeeded(f"ship/{n}"), TIMEOUT, what=f"barrier job {n}")


@pytest.fixture
def one_worker(broker_service, transactional_db):
    env = worker_env(CELERY_IDEM_MISSING_INTENT_TIMEOUT="2",
                     CELERY_IDEM_IN_PROGRESS_BACKOFF="0.5")
    with Worker(concurrency=1, env=env) as w:
        yield w


def test_rolled_back_publish_leaves_nothing_and_committed_runs_once(durability, one_worker):
    """delay, a signature and delay_on_commit/apply_async_on_commit (twice) inside
    atomic(): rolled back, no row and no effect; committed, one effect each. (Broker
    durability: no row in the transaction either, the message still after the commit.)"""
    with pytest.raises(Rollback), transaction.atomic():
        ship_order.delay(1101)
        ship_order.s(1102).apply_async()
        ship_order.delay_on_commit(1103)
        ship_order.apply_async_on_commit((1103,))
        assert Job.objects.filter(key="ship/1101", sent_at__isnull=True).exists() is (
            durability == "database")
        raise Rollback
    barrier(1199)
    assert not Job.objects.filter(key__in=["ship/1101", "ship/1102", "ship/1103"]).exists()
    assert not Effect.objects.filter(key__in=["ship/1101", "ship/1102", "ship/1103"]).exists()

    with transaction.atomic():
        ship_order.delay(1111)
        ship_order.delay_on_commit(1113)
        ship_order.delay_on_commit(1113)
        ship_order.apply_async_on_commit((1113,))
    wait_until(lambda: succeeded("ship/1111") and succeeded("ship/1113"), TIMEOUT,
               what="the committed jobs")
    barrier(1198)
    assert Effect.objects.filter(key="ship/1111").count() == 1
    assert Effect.objects.filter(key="ship/1113").count() == 1


@pytest.mark.needs_intent
def test_a_message_whose_intent_rolled_back_is_refused_not_run(durability, one_worker):
    """send_task by name inside atomic() (the hook writes the intent, but the message
    leaves at once), then a rollback: the worker waits for the intent, then refuses the
    message; the body never runs and no row appears."""
    with pytest.raises(Rollback), transaction.atomic():
        result = app.send_task(ship_order.name, args=[1121])
        raise Rollback
    # The line names the message: a message an earlier test left on the queue, whose
    # intent this test's database never had, is refused the same way.
    wait_until(lambda: f"refused message {result.id}" in one_worker.log(), TIMEOUT,
               what="the worker to refuse the message")
    assert not Job.objects.filter(key="ship/1121").exists()
    assert not Effect.objects.filter(key="ship/1121").exists()


@pytest.mark.needs_intent
def test_a_message_that_arrives_before_its_intent_commits_waits_and_runs_once(
        durability, broker_service, transactional_db):
    """send_task inside atomic(): the message leaves before the intent commits; the
    worker finds no row, re-queues it, and claims it once the transaction commits.
    On MariaDB/MySQL the uncommitted intent's row is locked (InnoDB locks the rows a
    transaction inserted), so the worker's claim waits for the commit instead."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite: the open transaction holds the only write lock, so the "
                    "worker's claim waits on the lock instead of finding no row")
    env = worker_env(CELERY_IDEM_MISSING_INTENT_TIMEOUT="60",
                     CELERY_IDEM_IN_PROGRESS_BACKOFF="0.5")
    with Worker(concurrency=1, env=env) as w:
        with transaction.atomic():
            app.send_task(ship_order.name, args=[1141])
            if connection.vendor == "mysql":
                wait_until(lambda: lock_waiters() == 1, TIMEOUT, POLL_SECONDS,
                           what="the worker's claim to wait for the intent's row")
            else:
                wait_until(lambda: "IntentMissing" in w.log(), TIMEOUT,
                           what="the worker to find no intent and wait")
        wait_until(lambda: succeeded("ship/1141"), TIMEOUT, what="the job after the commit")
    assert Effect.objects.filter(key="ship/1141").count() == 1


KILLED_PRODUCER = """
import os, signal, django
django.setup()
from django.db import connection, transaction
from django_app.effects.tasks import ship_order

with transaction.atomic():
    # Registered first, so it runs first after the commit: the process dies between
    # the commit and the outbox's send.
    transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
    ship_order.delay(1131)
"""


@pytest.mark.needs_intent
def test_producer_killed_between_commit_and_send_is_sent_by_recovery(
        durability, broker_service, transactional_db):
    """The intent committed, its message never left: recovery sends it after the
    never-sent timeout (2 s here), not the dispatch timeout; it runs once."""
    done = subprocess.run([sys.executable, "-c", KILLED_PRODUCER], env=worker_env(),
                          cwd=ROOT, timeout=60)
    assert done.returncode == -9
    job = Job.objects.get(key="ship/1131")
    assert (job.state, job.sent_at) == ("PENDING", None)
    with override_settings(CELERY_IDEM_NEVER_SENT_TIMEOUT=2), Worker(concurrency=1):
        wait_until(lambda: reaper.reap().total("redispatched") == 1, 30,
                   interval=0.5, what="recovery to send the never-sent intent")
        wait_until(lambda: succeeded("ship/1131"), TIMEOUT, what="the job")
    assert Effect.objects.filter(key="ship/1131").count() == 1
