"""Job rows with a believable history, for the admin tests and the docs' screenshots.

``make_job`` takes a job through the moves the protocol would make on the way to its
state, through the library's own backend (each move at its own moment) and fingerprint;
``populate`` writes a small shop's afternoon of jobs in every state.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from celery_idem.backends import Change, Claimant, Intent, get_backend
from celery_idem.fingerprints import fingerprint
from celery_idem.models import Checkpoint, Job
from celery_idem.states import State

TRACEBACK = """Traceback (most recent call last):
  File "/srv/shop/venv/lib/python3.12/site-packages/celery_idem/runner.py", line 78, in plain
    result = self.body(*self.args, **self.kwargs)
  File "/srv/shop/shop/tasks.py", line 48, in charge_card
    charge = gateway.capture(order.payment_intent, amount=order.total_cents)
  File "/srv/shop/shop/payments.py", line 117, in capture
    raise CardDeclined(response["decline_reason"], code=response["code"])
shop.payments.CardDeclined: {message}
"""

R = State.RUNNING


def _claim(backend: Any, intent: Intent, worker: str, task_id: str, at: datetime,
           lease: timedelta) -> int:
    """Claim the key at ``at``; the attempt the claim holds."""
    outcome = backend.claim("claimed", intent, Claimant(worker, task_id, at, at + lease))
    assert outcome.won and outcome.row is not None, outcome
    return int(outcome.row.attempt)


def make_job(key: str, state: State = State.PENDING, *,
             task_name: str = "shop.tasks.charge_card", args: Any = None, kwargs: Any = None,
             attempts: int = 1, worker: str = "celery@worker-1",
             age: timedelta = timedelta(minutes=10), run: timedelta = timedelta(seconds=2),
             stale: bool = False, dead_lettered: bool = False, error: dict | None = None,
             result: Any = None, retried: list[str] | None = None,
             backoff: timedelta = timedelta(seconds=30),
             not_before: datetime | None = None) -> Job:
    """A job in ``state`` after ``attempts`` claims, each move made at its moment."""
    backend, now = get_backend("default"), timezone.now()
    created = now - age
    if args is None and kwargs is None:
        kwargs = {"order_id": key.rsplit("-", 1)[-1]}
    args, kwargs = list(args or []), dict(kwargs or {})
    intent = Intent(task_name, key, task_name, fingerprint([args, kwargs]), args, kwargs,
                    {"queue": "payments"} if "charge" in task_name else {})
    task_id = str(uuid.uuid4())
    job_id = backend.publish(intent, task_id, created).row.id
    claims = attempts if state != State.PENDING else len(retried or [])
    at = created + timedelta(milliseconds=150)  # a worker picks the message up
    lease = timedelta(minutes=-3) - (now - at) if stale else timedelta(hours=1)
    attempt = 0
    for n in range(1, claims + 1):
        if n > 1:
            at += run + backoff
        attempt = _claim(backend, intent, worker, task_id, at, lease if n == claims else
                         timedelta(hours=1))
        if n < claims or state == State.PENDING:
            reasons = retried or ["ConnectionError: payment gateway timed out"]
            backend.apply(Change(job_id, "retry_scheduled", R, attempt, worker=worker,
                                 task_id=task_id, reason=reasons[min(n, len(reasons)) - 1],
                                 values={"lease_expires_at": None,
                                         "not_before": not_before if n == claims else None}),
                          at + run)
    end = at + run
    if state == State.SUCCEEDED:
        backend.apply(Change(job_id, "succeeded", R, attempt, worker=worker, task_id=task_id,
                             values={"result": result, "finished_at": end,
                                     "lease_expires_at": None}), end)
    elif state == State.FAILED:
        error = error or {"type": "CardDeclined", "module": "shop.payments",
                          "message": "card declined: insufficient funds (code 51)"}
        error.setdefault("traceback", TRACEBACK.format(message=error["message"]))
        event = "dead_lettered" if dead_lettered else "failed"
        reason = "dead-lettered" if dead_lettered else f"{error['type']}: {error['message']}"
        backend.apply(Change(job_id, event, R, attempt, worker=worker, task_id=task_id,
                             reason=reason, values={"error": error, "finished_at": end,
                                                    "lease_expires_at": None}), end)
    elif state == State.UNCERTAIN:
        backend.apply(Change(job_id, "uncertain", R, attempt, task_id=task_id,
                             reason="lease expired while it ran; the task must not re-run "
                                    "blindly", values={"lease_expires_at": None,
                                                       "worker": ""}), end)
    return Job.objects.get(pk=job_id)


def populate() -> dict[str, Job]:
    """A shop's afternoon: orders charged, shipped and mailed, with the usual trouble."""
    jobs = {}
    m, s = timedelta(minutes=1), timedelta(seconds=1)
    jobs["charged"] = make_job("charge/order-1041", State.SUCCEEDED, age=48 * m, run=1.3 * s,
                               result={"charge_id": "ch_3PqL9x2eZvKYlo2C", "amount": 5400,
                                       "currency": "EUR"}, worker="celery@payments-1")
    Checkpoint.objects.create(job=jobs["charged"], step="authorize", attempt=1,
                              value={"authorization": "pi_3PqL9x2eZvKYlo2C1"},
                              at=jobs["charged"].finished_at - 0.8 * s)
    Checkpoint.objects.create(job=jobs["charged"], step="capture", attempt=1,
                              value={"charge_id": "ch_3PqL9x2eZvKYlo2C"},
                              at=jobs["charged"].finished_at - 0.1 * s)
    jobs["shipped"] = make_job("ship/order-1041", State.SUCCEEDED,
                               task_name="shop.tasks.ship_order", age=46 * m, run=3.8 * s,
                               result={"shipped": "1041", "carrier": "DHL",
                                       "tracking": "00340434161094042557"},
                               worker="celery@fulfilment-2")
    jobs["stock"] = make_job("deduct/order-1041/sku-778", State.SUCCEEDED,
                             task_name="inventory.tasks.deduct_stock", age=47 * m, run=0.12 * s,
                             kwargs={"order_id": 1041, "product_id": "sku-778", "qty": 2},
                             result={"deducted": 2}, worker="celery@fulfilment-1")
    jobs["declined"] = make_job("charge/order-1044", State.FAILED, age=31 * m, run=2.4 * s,
                                attempts=2, worker="celery@payments-2")
    Checkpoint.objects.create(job=jobs["declined"], step="authorize", attempt=1,
                              value={"authorization": "pi_3PqM4k2eZvKYlo2C0"},
                              at=jobs["declined"].created_at + 0.9 * s)
    jobs["invoice"] = make_job(
        "invoice/INV-2026-0193", State.FAILED, task_name="billing.tasks.sync_invoice",
        age=3 * 60 * m, run=30 * s, attempts=5, backoff=8 * m, dead_lettered=True,
        worker="celery@billing-1",
        kwargs={"invoice": "INV-2026-0193"},
        retried=["ConnectionError: ERP API returned 503"] * 4,
        error={"type": "ConnectionError", "module": "builtins",
               "message": "ERP API returned 503 Service Unavailable",
               "traceback": "Traceback (most recent call last):\n  File \"/srv/shop/billing/"
                            "erp.py\", line 88, in push\n    response.raise_for_status()\n"
                            "ConnectionError: ERP API returned 503 Service Unavailable\n"},
    )
    jobs["receipt"] = make_job("receipt/order-1039", State.UNCERTAIN,
                               task_name="mail.tasks.send_receipt", age=95 * m, run=40 * s,
                               kwargs={"order_id": 1039, "to": "a.jansen@example.com"},
                               worker="celery@mail-1")
    jobs["charging"] = make_job("charge/order-1045", State.RUNNING, age=12 * s, run=0 * s,
                                worker="celery@payments-1")
    jobs["export"] = make_job("export/2026-11-21", State.RUNNING,
                              task_name="reports.tasks.nightly_export", age=75 * m, stale=True,
                              kwargs={"day": "2026-11-21"}, worker="celery@reports-1")
    jobs["retrying"] = make_job("ship/order-1043", State.PENDING,
                                task_name="shop.tasks.ship_order", age=6 * m, run=1.1 * s,
                                retried=["ConnectionError: carrier API timed out"],
                                not_before=timezone.now() + 2 * m)
    jobs["queued"] = make_job("ship/order-1045", State.PENDING, task_name="shop.tasks.ship_order",
                              age=5 * s)
    jobs["charged2"] = make_job("charge/order-1042", State.SUCCEEDED, age=40 * m, run=0.9 * s,
                                attempts=2, result={"charge_id": "ch_3PqLB12eZvKYlo2C",
                                                    "amount": 12900, "currency": "EUR"},
                                worker="celery@payments-2")
    jobs["shipped2"] = make_job("ship/order-1042", State.SUCCEEDED,
                                task_name="shop.tasks.ship_order", age=38 * m, run=4.2 * s,
                                result={"shipped": "1042", "carrier": "PostNL",
                                        "tracking": "3SABCD0123456789"},
                                worker="celery@fulfilment-1")
    jobs["receipt2"] = make_job("receipt/order-1042", State.SUCCEEDED,
                                task_name="mail.tasks.send_receipt", age=37 * m, run=0.6 * s,
                                kwargs={"order_id": 1042, "to": "m.deboer@example.com"},
                                result={"message_id": "<20261121.1042@shop.example>"},
                                worker="celery@mail-1")
    return jobs
