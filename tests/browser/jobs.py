"""Job rows with a believable history, for the admin tests and the docs' screenshots.

``make_job`` writes a job and the history rows the protocol would have written on the way
to its state; ``populate`` writes a small shop's afternoon of jobs in every state.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import timedelta
from typing import Any

from django.utils import timezone

from celery_idem.models import Checkpoint, Job, Transition
from celery_idem.states import State

TRACEBACK = """Traceback (most recent call last):
  File "/srv/shop/venv/lib/python3.12/site-packages/celery_idem/task.py", line 262, in __call__
    result = super().__call__(*args, **kwargs)
  File "/srv/shop/shop/tasks.py", line 48, in charge_card
    charge = gateway.capture(order.payment_intent, amount=order.total_cents)
  File "/srv/shop/shop/payments.py", line 117, in capture
    raise CardDeclined(response["decline_reason"], code=response["code"])
shop.payments.CardDeclined: {message}
"""


def fingerprint(args: Any, kwargs: Any) -> str:
    canonical = json.dumps([args, kwargs], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def make_job(key: str, state: State = State.PENDING, *,
             task_name: str = "shop.tasks.charge_card", args: Any = None, kwargs: Any = None,
             attempts: int = 1, worker: str = "celery@worker-1",
             age: timedelta = timedelta(minutes=10), run: timedelta = timedelta(seconds=2),
             stale: bool = False, dead_lettered: bool = False, error: dict | None = None,
             result: Any = None, retried: list[str] | None = None,
             backoff: timedelta = timedelta(seconds=30), **fields: Any) -> Job:
    """A job in ``state`` with the history that got it there (``attempts`` claims)."""
    now = timezone.now()
    created = now - age
    if args is None and kwargs is None:
        kwargs = {"order_id": key.rsplit("-", 1)[-1]}
    values: dict[str, Any] = {
        "namespace": task_name, "key": key, "task_name": task_name, "args": args or [],
        "kwargs": kwargs or {}, "fingerprint": fingerprint(args or [], kwargs or {}),
        "options": {"queue": "payments"} if "charge" in task_name else {},
        "state": state, "attempt": 0 if state == State.PENDING and not retried else attempts,
        "task_id": str(uuid.uuid4()), "created_at": created, "updated_at": created,
        "dispatch_count": 1, "worker": worker if state != State.PENDING else "",
    }
    values.update(fields)
    job = Job.objects.create(**values)
    history: list[dict[str, Any]] = [
        {"event": "published", "from_state": None, "to_state": State.PENDING, "attempt": 0,
         "task_id": job.task_id, "at": created}
    ]
    at = created + timedelta(milliseconds=150)  # a worker picks the message up
    claims = attempts if state != State.PENDING else len(retried or [])
    for attempt in range(1, claims + 1):
        if attempt > 1:
            at += run + backoff
        history.append({"event": "claimed", "from_state": State.PENDING,
                        "to_state": State.RUNNING, "attempt": attempt, "worker": worker,
                        "task_id": job.task_id, "at": at})
        if attempt < claims or state == State.PENDING:
            reason = (retried or ["ConnectionError: payment gateway timed out"])[
                min(attempt - 1, len(retried or [""]) - 1)]
            history.append({"event": "retry_scheduled", "from_state": State.RUNNING,
                            "to_state": State.PENDING, "attempt": attempt, "worker": worker,
                            "task_id": job.task_id, "reason": reason, "at": at + run})
    end = at + run if claims else created
    if state == State.SUCCEEDED:
        history.append({"event": "succeeded", "from_state": State.RUNNING,
                        "to_state": State.SUCCEEDED, "attempt": claims, "worker": worker,
                        "task_id": job.task_id, "at": end})
        job.result, job.finished_at = result, end
    elif state == State.FAILED:
        error = error or {"type": "CardDeclined", "module": "shop.payments",
                          "message": "card declined: insufficient funds (code 51)"}
        error.setdefault("traceback", TRACEBACK.format(message=error["message"]))
        event = "dead_lettered" if dead_lettered else "failed"
        reason = "dead-lettered" if dead_lettered else f"{error['type']}: {error['message']}"
        history.append({"event": event, "from_state": State.RUNNING, "to_state": State.FAILED,
                        "attempt": claims, "worker": worker, "task_id": job.task_id,
                        "reason": reason, "at": end})
        job.error, job.finished_at = error, end
    elif state == State.UNCERTAIN:
        history.append({"event": "uncertain", "from_state": State.RUNNING,
                        "to_state": State.UNCERTAIN, "attempt": claims, "worker": "",
                        "task_id": job.task_id, "at": end,
                        "reason": "lease expired while it ran; the task must not re-run blindly"})
        job.error = {"type": "WorkerLostError", "module": "billiard.exceptions",
                     "message": "Worker exited prematurely: signal 9 (SIGKILL)."}
    elif state == State.RUNNING:
        end = at
        lease = timedelta(minutes=-3) if stale else timedelta(minutes=55)
        job.lease_expires_at = now + lease
        job.worker = worker
    if state != State.PENDING or claims:
        job.started_at = at
    for row in history:
        Transition.objects.create(job=job, **row)
    job.updated_at = min(end, now)
    job.save()
    return job


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
