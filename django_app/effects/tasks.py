"""Tasks the tests, benchmarks and local development run: each records its effect."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

from celery import shared_task
from django.db.models import F

import celery_idem
from celery_idem import ALL_ARGUMENTS, PER_CALL, IdempotentTask, LeaderTask

from ..fakes.client import create_charge
from .models import Effect, Stock, StockDeduction


def _effect(task, **value) -> Effect:
    return Effect.objects.create(key=task.idempotency_key, value=value, attempt=task.attempt,
                                 pid=os.getpid())


@shared_task(base=IdempotentTask, bind=True, idempotency_key="ship/{order_id}")
def ship_order(self, order_id, hold=0.0):
    """Records one effect per order; ``hold`` keeps the claim for that many seconds."""
    _effect(self, order_id=order_id)
    if hold:
        time.sleep(hold)
    return {"shipped": order_id, "attempt": self.attempt}


@celery_idem.task(key="pack/{order_id}")
def pack_order(order_id):
    """Declared the short way: not bound (no ``self``), the key a template."""
    Effect.objects.create(key=f"pack/{order_id}", value={"order_id": order_id},
                          pid=os.getpid())
    return {"packed": order_id}


@shared_task(base=IdempotentTask, bind=True, atomic=True,
             idempotency_key="deduct/{order_id}/{product_id}")
def deduct_stock(self, order_id, product_id, qty, hold=0.0):
    """Atomic: the effect row and the job's commit are one transaction."""
    _effect(self, order_id=order_id, product_id=product_id, qty=qty)
    if hold:
        time.sleep(hold)
    return {"deducted": qty, "attempt": self.attempt}


@shared_task(base=IdempotentTask, bind=True, idempotency_key=PER_CALL)
def notify(self, user_id, text):
    _effect(self, user_id=user_id, text=text)
    return text


@shared_task(base=IdempotentTask, bind=True, idempotency_key=ALL_ARGUMENTS)
def add(self, x, y=0):
    _effect(self, x=x, y=y)
    return x + y


@shared_task(base=IdempotentTask, bind=True, idempotency_key="fail/{n}")
def always_fails(self, n):
    _effect(self, n=n)
    raise ValueError(f"boom {n}")


@shared_task(base=IdempotentTask, bind=True, idempotency_key="flaky/{n}", max_retries=3,
             default_retry_delay=0)
def flaky(self, n, failures=1):
    """Fails ``failures`` times through self.retry, then succeeds."""
    _effect(self, n=n)
    if self.request.retries < failures:
        raise self.retry(exc=RuntimeError("not yet"), countdown=0)
    return {"n": n, "attempt": self.attempt, "retries": self.request.retries}


@shared_task(base=IdempotentTask, bind=True, idempotency_key="auto/{n}",
             autoretry_for=(ConnectionError,), max_retries=2, default_retry_delay=0,
             retry_backoff=False)
def autoretried(self, n, failures=1):
    _effect(self, n=n)
    if self.request.retries < failures:
        raise ConnectionError("transient")
    return self.attempt


@shared_task(base=IdempotentTask, bind=True, atomic=True, idempotency_key="atomic-fail/{n}")
def atomic_fails(self, n):
    _effect(self, n=n)
    raise ValueError("rolled back")


@shared_task(base=IdempotentTask, bind=True, idempotency_key="wait/{name}")
def wait_for_file(self, name, folder):
    """Records its effect, then blocks until ``folder/name`` exists (crash tests)."""
    _effect(self, name=name)
    flag = Path(folder) / name
    deadline = time.monotonic() + 120
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return name


@shared_task(base=IdempotentTask, bind=True, idempotency_key="parent/{n}", atomic=True)
def parent_sends_child(self, n):
    _effect(self, n=n)
    notify.delay(n, f"child of {n}")
    return n


@shared_task(bind=True)
def plain_effect(self, key):
    """The plain-Celery baseline: one row, no idempotency."""
    Effect.objects.create(key=key, pid=os.getpid())
    return key


@shared_task
def ping():
    return "pong"




@shared_task(base=IdempotentTask, bind=True, atomic=True, idempotency_key="wait-atomic/{name}")
def wait_for_file_atomic(self, name, folder):
    """Atomic: records its effect inside the claim's transaction, touches
    ``folder/name.started`` (the effect is not visible before the commit), then blocks
    until ``folder/name`` exists (crash tests)."""
    _effect(self, name=name)
    Path(folder, f"{name}.started").write_text(str(os.getpid()))
    flag = Path(folder) / name
    deadline = time.monotonic() + 120
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return name


@shared_task(base=IdempotentTask, bind=True, atomic="optimistic",
             idempotency_key="wait-optimistic/{name}")
def wait_for_file_optimistic(self, name, folder, wait_for=1):
    """atomic="optimistic": waits until ``folder/name`` exists or ``wait_for`` bodies of
    ``name`` have started (each touched ``folder/name.<pid>.started``: a barrier for
    concurrent duplicates), then records its effect; returns the pid whose body ran."""
    _barrier(folder, name, wait_for)
    _effect(self, name=name)
    return {"name": name, "pid": os.getpid()}


def _barrier(folder: str, name: str, wait_for: int) -> None:
    Path(folder, f"{name}.{os.getpid()}.started").write_text(str(os.getpid()))
    flag, deadline = Path(folder) / name, time.monotonic() + 120
    while not flag.exists() and time.monotonic() < deadline:
        if wait_for > 1 and len(list(Path(folder).glob(f"{name}.*.started"))) >= wait_for:
            return
        time.sleep(0.05)


@shared_task(base=IdempotentTask, bind=True, atomic="optimistic",
             idempotency_key="deduct-optimistic/{order_id}/{sku}")
def deduct_optimistic(self, order_id, sku, folder):
    """atomic="optimistic": two copies pass a barrier, then insert the same (order, sku)
    deduction: the second waits on the first's uncommitted unique entry and fails with a
    unique violation once the first commits."""
    _barrier(folder, f"deduct-{order_id}-{sku}", wait_for=2)
    StockDeduction.objects.create(order_id=order_id, sku=sku, quantity=1)
    return {"deducted": 1, "pid": os.getpid()}


@shared_task(base=IdempotentTask, bind=True, idempotency_key="attempt/{name}")
def wait_per_attempt(self, name, folder):
    """Records its effect, then blocks until ``folder/<name>-<attempt>`` exists, so a test
    lets each attempt finish in its turn (a zombie's after its successor's); returns which
    attempt ran."""
    _effect(self, name=name)
    _hold(folder, f"{name}-{self.attempt}")
    return {"name": name, "attempt": self.attempt}


def _hold(folder: str, name: str) -> None:
    """Touch ``folder/name.started`` (with this pid), then block until ``folder/name``
    exists: a crash test kills the process in between."""
    Path(folder, f"{name}.started").write_text(str(os.getpid()))
    flag = Path(folder) / name
    deadline = time.monotonic() + 120
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@shared_task(base=IdempotentTask, bind=True, idempotency_key="charge/{order_id}",
             autoretry_for=(OSError,), max_retries=3, retry_backoff=True)
def charge_card(self, order_id, cents, provider_url, folder=None):
    """External keys: the provider's ``Idempotency-Key`` is ``self.external_key("charge")``,
    the same on every attempt, so a re-run after a crash gets the stored charge back.
    A network error (OSError) is retried with the same key. ``folder``: hold after the
    charge, before the commit (crash tests)."""
    charge = create_charge(provider_url, amount=cents, currency="eur",
                           reference=f"order-{order_id}",
                           idempotency_key=self.external_key("charge"))
    if folder:
        _hold(folder, f"charge-{order_id}")
    return {"charge": charge["id"], "amount": charge["amount"], "attempt": self.attempt}


@shared_task(base=IdempotentTask, bind=True, atomic=True,
             idempotency_key="stock/{order_id}/{sku}")
def deduct_stock_once(self, order_id, sku, qty, folder=None):
    """Check-then-act in the job's transaction: lock the product, look for this order's
    deduction, deduct and record it, all committed with the job or not at all.
    ``folder``: hold after the deduction, before the commit (crash tests)."""
    # The lock makes a second deduction of this order (under another key) wait for the
    # first to commit, so its check sees the record instead of tripping the constraint.
    stock = Stock.objects.select_for_update().get(sku=sku)
    if StockDeduction.objects.filter(order_id=order_id, sku=sku).exists():
        return {"deducted": 0, "quantity": stock.quantity}
    Stock.objects.filter(pk=stock.pk).update(quantity=F("quantity") - qty)
    StockDeduction.objects.create(order_id=order_id, sku=sku, quantity=qty, attempt=self.attempt)
    if folder:
        _hold(folder, f"stock-{order_id}-{sku}")
    return {"deducted": qty, "quantity": stock.quantity - qty}

# -- a body whose database connection is lost (tests/integration/test_lost_connection.py) --


def connection_id() -> int:
    """The server's id of this thread's Django connection (the session a test kills)."""
    from django.db import connection

    sql = ("SELECT CONNECTION_ID()" if connection.vendor == "mysql"
           else "SELECT pg_backend_pid()")
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return int(cursor.fetchone()[0])


def _query_after_hold(task, name: str, folder: str) -> dict:
    """Record the effect, hold (``folder/name.started`` holds the connection's id), then
    use the connection again: the query a killed session fails."""
    _effect(task, name=name)
    Path(folder, f"{name}.started").write_text(str(connection_id()))
    flag = Path(folder) / name
    deadline = time.monotonic() + 120
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"effects": Effect.objects.filter(key=task.idempotency_key).count(),
            "attempt": task.attempt}


@shared_task(base=IdempotentTask, bind=True, idempotency_key="lost/{name}")
def query_after_hold(self, name, folder):
    return _query_after_hold(self, name, folder)


@shared_task(base=IdempotentTask, bind=True, atomic=True, idempotency_key="lost-atomic/{name}")
def query_after_hold_atomic(self, name, folder):
    return _query_after_hold(self, name, folder)


@shared_task(base=IdempotentTask, bind=True, on_stale_claim="uncertain",
             idempotency_key="lost-uncertain/{name}")
def query_after_hold_uncertain(self, name, folder):
    return _query_after_hold(self, name, folder)


@shared_task(base=IdempotentTask, bind=True, max_attempts=1, idempotency_key="lost-once/{name}")
def query_after_hold_once(self, name, folder):
    return _query_after_hold(self, name, folder)


@shared_task(base=IdempotentTask, bind=True, idempotency_key="sleep/{name}")
def sleep_in_body(self, name, folder):
    """Writes its connection's id to ``folder/name.started``, then sleeps in a query (for
    a test to interrupt)."""
    from django.db import connection

    Path(folder, f"{name}.started").write_text(str(connection_id()))
    sql = "SELECT SLEEP(60)" if connection.vendor == "mysql" else "SELECT pg_sleep(60)"
    with connection.cursor() as cursor:
        cursor.execute(sql)
    return name


# -- step checkpoints and child keys ------------------------------------------------------


def _step_effect(key: str, name: str, attempt: int | None) -> dict:
    """A step's effect: one Effect row per run of the step, so tests count the runs."""
    Effect.objects.create(key=f"{key}/{name}", value={"step": name}, attempt=attempt,
                          pid=os.getpid())
    return {"step": name, "attempt": attempt}


@shared_task(base=IdempotentTask, bind=True, idempotency_key="steps/{n}")
def three_steps(self, n, folder=None):
    """Three checkpointed steps; ``folder``: hold after step two (crash tests)."""
    one = self.step("one", _step_effect, self.idempotency_key, "one", self.attempt)
    two = self.step("two", _step_effect, self.idempotency_key, "two", self.attempt)
    if folder:
        _hold(folder, f"steps-{n}")
    three = self.step("three", _step_effect, self.idempotency_key, "three", self.attempt)
    return [one, two, three]


@shared_task(base=IdempotentTask, bind=True, idempotency_key="family/{n}")
def send_two_children(self, n, folder=None):
    """Sends two PER_CALL children without keys (they get keys derived from this job);
    ``folder``: hold after sending, before the commit (crash tests)."""
    first = notify.delay(n, "first child")
    second = notify.delay(n, "second child")
    if folder:
        _hold(folder, f"family-{n}")
    return [first.id, second.id]


# -- leader-owned coordinators (celery_idem.LeaderTask) ------------------------------------


def fenced_effect(name: str, token: int, **value) -> Effect:
    """A coordinator's write: checked against its fencing token in its own transaction, so
    a holder that lost the shard cannot land it (raises LeaseLost)."""
    from django.db import transaction

    from celery_idem import leases

    with transaction.atomic():
        leases.check(name, token)
        return Effect.objects.create(key=name, value=value, attempt=token, pid=os.getpid())


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")  # a SIGKILLed process nobody reaped yet is dead too


def _enter_alone(marker: Path) -> bool:
    """Create ``marker`` holding this pid; False if a live process holds it (an overlap)."""
    while True:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                other = int(marker.read_text())
            except (FileNotFoundError, ValueError):
                return False  # another body is entering right now
            if _alive(other):
                return False
            marker.unlink(missing_ok=True)  # left by a killed holder
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True


@shared_task(base=LeaderTask, bind=True, shard="coord/{shard}", lease=4)
def coordinator_tick(self, shard, folder, hold=0.2):
    """A coordinator tick: records a fenced effect per run, and an ``overlap/`` effect if
    it finds another live body of the same shard running (``folder/<shard>.running``)."""
    from django.utils import timezone

    marker = Path(folder) / f"{shard}.running"
    if not _enter_alone(marker):
        Effect.objects.create(key=f"overlap/{shard}", pid=os.getpid(), attempt=self.fencing_token)
        return "overlap"
    try:
        fenced_effect(self.lease_name, self.fencing_token, at=timezone.now().isoformat(),
                      holder=self.held_lease.holder)
        time.sleep(hold)  # the coordinator's work
    finally:
        marker.unlink(missing_ok=True)
    return self.fencing_token


@shared_task(base=IdempotentTask, bind=True, idempotency_key="collect/{tag}")
def collect(self, results, tag):
    """A chord's callback: records the header's results once per tag."""
    _effect(self, results=sorted(results), tag=tag)
    return sorted(results)


@shared_task(base=IdempotentTask, bind=True, idempotency_key="retries/{n}", max_retries=2)
def retries_twice(self, n, first_countdown=0):
    """Retries until Celery's max_retries (2) is spent: at most 3 attempts, then fails.
    The first retry waits ``first_countdown`` seconds (time to lose its message)."""
    _effect(self, n=n, retries=self.request.retries)
    countdown = first_countdown if self.request.retries == 0 else 0
    raise self.retry(exc=RuntimeError(f"attempt {self.attempt}"), countdown=countdown)


from .chaos_tasks import *  # noqa: E402,F403  (the chaos suite's tasks, tests/chaos)
from .compat_tasks import *  # noqa: E402,F403  (Celery-suite shaped PER_CALL tasks)
from .path_tasks import *  # noqa: E402,F403  (registered with the other test tasks)

if importlib.util.find_spec("pydantic") is not None:  # in the test extra
    from .pydantic_tasks import *  # noqa: E402,F403  (Celery's pydantic=True tasks)
