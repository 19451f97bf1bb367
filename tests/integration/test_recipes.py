"""The recipes of the how-to guides (docs/how-to/) under crashes, with real worker
processes: an external key makes a charge once at the provider, and a check-then-act in
the job's transaction deducts stock once."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from celery_idem.models import Transition
from celery_idem.recovery import sweep as reaper
from django_app.effects.models import Stock, StockDeduction
from django_app.effects.tasks import charge_card, deduct_stock_once

from .jobs import TIMEOUT, events, job, later
from .workers import Worker, wait_until


@pytest.fixture
def flags(tmp_path: Path, broker_service, transactional_db) -> Path:
    return tmp_path


def test_a_charge_crashed_before_its_commit_is_made_once_at_the_provider(flags, fake_provider):
    """The whole worker is SIGKILLed after the provider charged and before the job's commit;
    recovery runs attempt 2, which sends the same Idempotency-Key and gets the stored charge
    back: one charge at the provider, the job SUCCEEDED with it."""
    first = Worker(concurrency=2).start()
    try:
        charge_card.delay(7, 1250, fake_provider.url, str(flags))
        wait_until(lambda: (flags / "charge-7.started").exists(), TIMEOUT, what="the charge")
    finally:
        first.kill()
    assert job("charge/7").state == "RUNNING" and fake_provider.provider.count() == 1
    (flags / "charge-7").touch()
    # Nothing claims while the clock moves: the only worker is dead, the next starts after.
    assert reaper.reap(now=later()).as_dict() == {"released": {charge_card.name: 1}}
    with Worker(concurrency=2):
        wait_until(lambda: job("charge/7").state == "SUCCEEDED", TIMEOUT, what="success")
    assert fake_provider.provider.count() == 1
    assert job("charge/7").result == {"charge": "ch_000001", "amount": 1250, "attempt": 2}
    (key, created), (again, replayed) = fake_provider.provider.requests
    assert key == again and key.startswith("idem-") and (created, replayed) == (201, 200)
    assert events("charge/7")[-1] == "released" and job("charge/7").attempt == 2


def test_stock_is_deducted_once_across_copies_a_killed_child_and_another_key(flags):
    """atomic=True with a check-then-act: the pool child is SIGKILLed after deducting and
    before the commit (its deduction rolls back), the key is published three times more,
    and the same order arrives under another key: the stock moves once."""
    Stock.objects.create(sku="widget", quantity=10)
    key = "stock/5/widget"
    with Worker(concurrency=2) as worker:
        deduct_stock_once.delay(5, "widget", 3, str(flags))
        started = flags / "stock-5-widget.started"
        wait_until(started.exists, TIMEOUT, what="the deduction")
        pid = int(started.read_text())
        assert pid in worker.children(), (pid, worker.children())
        os.kill(pid, signal.SIGKILL)
        # The worker notes the loss before Celery requeues the message: wait for it, so
        # the copies below cannot take the key first (the note is only for its message).
        wait_until(lambda: "attempt_lost" in events(key), TIMEOUT, what="the loss noted")
        (flags / "stock-5-widget").touch()
        copies = [deduct_stock_once.delay(5, "widget", 3, str(flags)) for _ in range(3)]
        reaper.reap()
        wait_until(lambda: job(key).state == "SUCCEEDED", TIMEOUT, what="success")
        answers = [copy.get(timeout=TIMEOUT) for copy in copies]
        other = deduct_stock_once.apply_async(args=(5, "widget", 3),
                                              idempotency_key="stock/5/widget/resent")
        assert other.get(timeout=TIMEOUT) == {"deducted": 0, "quantity": 7}
    assert answers == [{"deducted": 3, "quantity": 7}] * 3
    assert Stock.objects.get(sku="widget").quantity == 7
    # The killed attempt's claim rolled back with its body, so the deduction that stayed
    # belongs to the attempt that committed; the history still records the lost one.
    deduction = StockDeduction.objects.get(order_id=5, sku="widget")
    assert deduction.attempt == job(key).attempt
    # The claim that committed came after the loss (the happy path is on the row).
    lost = Transition.objects.get(job__key=key, event="attempt_lost")
    assert job(key).started_at > lost.at
