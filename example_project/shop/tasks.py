"""The shop's tasks: one per kind of effect, each made exactly once its own way
(the how-to guides in docs/how-to/). ``shop.orders.place_order`` publishes the first five;
on Django 6.0+ ``ship_order`` is a task of Django's own Tasks framework."""

import random
import time

import django
from celery import shared_task
from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import F

import celery_idem
from celery_idem import IdempotentTask, LeaderTask

from .models import OcrRun, Order, Product, SearchEntry, Shipment, StockDeduction, TenantReport
from .payments import create_charge


def _slow_service() -> None:
    """Real services take a moment: duplicates of a message arrive meanwhile."""
    time.sleep(random.uniform(0.05, 0.15))


@shared_task(base=IdempotentTask, bind=True, idempotency_key="charge/{order_id}",
             autoretry_for=(OSError,), max_retries=5, retry_backoff=True)
def charge_payment(self, order_id):
    """External key: the provider charges once per key, however often this runs."""
    order = Order.objects.get(pk=order_id)
    charge = create_charge(settings.SHOP_PROVIDER_URL, amount=order.total_cents,
                           currency="eur", reference=f"order-{order_id}",
                           idempotency_key=self.external_key("charge"))
    _slow_service()
    Order.objects.filter(pk=order_id).update(charge_id=charge["id"])
    return {"charge": charge["id"]}


@shared_task(base=IdempotentTask, bind=True, idempotency_key="confirm/{order_id}")
def send_confirmation(self, order_id):
    """Not idempotent: at most one successful run; a crash between the send and the
    commit sends it again (once per crash)."""
    order = Order.objects.get(pk=order_id)
    EmailMessage(
        subject=f"Your order {order_id}", body=f"{order.quantity} x {order.sku}, thank you.",
        to=[order.email], headers={"X-Idempotency-Key": self.idempotency_key,
                                   "X-Attempt": str(self.attempt),
                                   "X-Worker": self.request.hostname or ""},
    ).send()
    _slow_service()
    return {"sent_to": order.email}


@shared_task(base=IdempotentTask, bind=True, atomic=True, idempotency_key="stock/{order_id}")
def deduct_stock(self, order_id):
    """Atomic: the deduction and the job's SUCCEEDED commit together, or neither."""
    order = Order.objects.get(pk=order_id)
    product = Product.objects.select_for_update().get(sku=order.sku)
    if StockDeduction.objects.filter(order=order).exists():  # another key got here first
        return {"deducted": 0}
    Product.objects.filter(pk=product.pk).update(quantity=F("quantity") - order.quantity)
    StockDeduction.objects.create(order=order, sku=order.sku, quantity=order.quantity,
                                  attempt=self.attempt)
    # Nothing slow in here: the transaction (and on SQLite the database's one write
    # lock) is held for the whole body.
    return {"deducted": order.quantity}


def _ship(order_id):
    """Naturally idempotent: an upsert by order leaves one shipment however often it runs."""
    order = Order.objects.get(pk=order_id)
    _slow_service()
    shipment, _ = Shipment.objects.update_or_create(
        order=order, defaults={"warehouse": f"wh-{order.tenant}", "address": order.email})
    Shipment.objects.filter(pk=shipment.pk).update(writes=F("writes") + 1)
    return {"shipment": shipment.pk}


if django.VERSION >= (6, 0):
    # Django's own Tasks framework, run on the same workers by celery-idem's backend
    # (TASKS in settings.py): enqueue with ship_order.enqueue(order_id). On Django 6.1
    # django.tasks.task takes the key too; the backend's decorator takes it on 6.0 as well.
    from celery_idem.tasks_backend import task as django_task

    @django_task(idempotency_key="ship/{order_id}")
    def ship_order(order_id):
        return _ship(order_id)
else:
    @celery_idem.task(key="ship/{order_id}")  # short for shared_task(base=IdempotentTask, ...)
    def ship_order(order_id):
        return _ship(order_id)


def run_ocr(order_id, attempt, worker):
    """The slow, paid part: what a checkpoint saves a later attempt from redoing."""
    OcrRun.objects.create(order_id=order_id, attempt=attempt, worker=worker)
    _slow_service()
    return f"invoice for order {order_id}"


def update_index(order_id, text):
    entry, _ = SearchEntry.objects.update_or_create(order_id=order_id, defaults={"text": text})
    return entry.pk


@shared_task(base=IdempotentTask, bind=True, idempotency_key="index/{order_id}")
def index_attachment(self, order_id):
    """Steps: a later attempt gets the stored OCR text back and only updates the index."""
    text = self.step("ocr", run_ocr, order_id, self.attempt, self.request.hostname or "")
    entry = self.step("index", update_index, order_id, text)
    return {"entry": entry}


@shared_task(base=LeaderTask, bind=True, shard="tenant/{tenant}", lease=3)
def coordinate_tenant(self, tenant):
    """A tick from beat; only the holder of tenant/<name>'s lease runs it."""
    with transaction.atomic():
        self.check_lease()  # LeaseLost once another worker holds the tenant
        paid = Order.objects.filter(tenant=tenant).exclude(charge_id="").count()
        TenantReport.objects.create(tenant=tenant, token=self.fencing_token,
                                    holder=f"{self.request.hostname}", paid_orders=paid)
    return paid
