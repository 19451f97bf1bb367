"""``atomic="optimistic"`` with real prefork workers and broker durability: concurrent
duplicates that both run the body, a unique row both copies write, a pool child
SIGKILLed inside the body, a finished key's message run again. The database effect lands
once in each; the statements per path are tests/db/test_optimistic.py's."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from django.conf import settings as conf

from celery_idem.models import Job, Transition
from django_app.effects.models import Effect, StockDeduction
from django_app.effects.tasks import deduct_optimistic, wait_for_file_optimistic

from .jobs import TIMEOUT, job
from .workers import Worker, purge_queue, wait_until

#: Two bodies inside their transactions at once: SQLite has one writer, which the
#: first body holds while it waits at the barrier for the second.
two_writers = pytest.mark.skipif(conf.DATABASE_KIND == "sqlite",
                                 reason="SQLite has one writer: two bodies cannot be "
                                        "inside their transactions at once")


@pytest.fixture
def flags(tmp_path, broker_service, transactional_db, monkeypatch, settings):
    """Broker durability (no intent at publish: the optimistic path runs) in this process
    and in the workers started after it, a purged queue, and a folder for the flags."""
    settings.CELERY_IDEM_DURABILITY = "broker"
    monkeypatch.setenv("CELERY_IDEM_DURABILITY", json.dumps("broker"))
    purge_queue()
    return tmp_path


def started(folder: Path, name: str) -> list[int]:
    """Pids of the bodies of ``name`` that started."""
    return sorted(int(p.read_text()) for p in folder.glob(f"{name}.*.started"))


@two_writers
def test_concurrent_duplicates_both_run_the_body_and_the_effect_lands_once(flags):
    """Two messages of one key, both bodies inside at once (a barrier holds each until
    both started): the first insert of the finished row wins, the other copy's insert
    waits for it, finds the row, rolls its body back and replays the winner's result."""
    with Worker(concurrency=2) as w:
        results = [wait_for_file_optimistic.delay("dup", str(flags), 2) for _ in range(2)]
        values = [r.get(timeout=TIMEOUT) for r in results]
        w.assert_no_persistence_errors()
    assert len(started(flags, "dup")) == 2  # both bodies ran, at once
    assert values[0] == values[1] and values[0]["pid"] in started(flags, "dup")
    assert Effect.objects.filter(key="wait-optimistic/dup").count() == 1
    assert (job("wait-optimistic/dup").state, job("wait-optimistic/dup").attempt) == (
        "SUCCEEDED", 1)
    assert not Transition.objects.exists()


@two_writers
def test_a_unique_row_both_copies_write_fails_the_loser_which_then_replays(flags):
    """Both copies insert the same (order, sku) row: the second waits on the first's
    uncommitted entry and gets a unique violation once the first commits. Its first run
    rolls back, and its run under a claim finds the key finished: replayed, not FAILED."""
    with Worker(concurrency=2):
        results = [deduct_optimistic.delay(5, "sku-1", str(flags)) for _ in range(2)]
        values = [r.get(timeout=TIMEOUT) for r in results]
    assert len(started(flags, "deduct-5-sku-1")) == 2
    assert values[0] == values[1] and values[0]["deducted"] == 1
    assert StockDeduction.objects.filter(order_id=5, sku="sku-1").count() == 1
    assert job("deduct-optimistic/5/sku-1").state == "SUCCEEDED"


def test_child_killed_in_the_body_is_redelivered_and_the_effect_lands_once(flags):
    """SIGKILL of the pool child inside the body, before its commit: the transaction dies
    with it and no row exists; the message comes back (acks_late, reject_on_worker_lost),
    and the next delivery runs the body again and commits it, once."""
    with Worker(concurrency=2) as w:
        result = wait_for_file_optimistic.delay("kchild", str(flags))
        (pid,) = wait_until(lambda: started(flags, "kchild"), TIMEOUT,
                            what="the body to start")
        assert pid in w.children() and not Job.objects.exists()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: pid not in w.children(), 30, what="the child to die")
        wait_until(lambda: len(started(flags, "kchild")) == 2, TIMEOUT,
                   what="the redelivered body")
        (flags / "kchild").touch()
        value = result.get(timeout=TIMEOUT)
        w.assert_no_persistence_errors()
    assert value["pid"] != pid
    assert Effect.objects.filter(key="wait-optimistic/kchild").count() == 1
    assert (job("wait-optimistic/kchild").state, job("wait-optimistic/kchild").attempt) == (
        "SUCCEEDED", 1)


def test_a_finished_keys_message_run_again_replays_without_a_second_effect(flags):
    """The same message twice, one after the other (a redelivery, a re-send): the second
    body runs, its insert finds the finished row, and its writes roll back."""
    (flags / "again").touch()
    with Worker(concurrency=2):
        first = wait_for_file_optimistic.delay("again", str(flags)).get(timeout=TIMEOUT)
        second = wait_for_file_optimistic.delay("again", str(flags)).get(timeout=TIMEOUT)
    assert second == first
    assert Effect.objects.filter(key="wait-optimistic/again").count() == 1
    assert job("wait-optimistic/again").attempt == 1
