"""Placing an order: the order row and its tasks' intents in one transaction (the
outbox): the messages leave when it commits, and a rollback leaves no job at all."""

from django.db import transaction

from .models import Order
from .tasks import charge_payment, deduct_stock, index_attachment, send_confirmation, ship_order

TASKS = (charge_payment, send_confirmation, deduct_stock, ship_order, index_attachment)


def publish(task, order_id):
    """Send one of ``TASKS`` for the order: Django's ``enqueue`` for a Django task (on
    Django 6.0+, ``ship_order``), Celery's ``delay`` for the others. Either way a
    duplicate meets the key's one job, and inside a transaction it leaves on commit."""
    enqueue = getattr(task, "enqueue", None)
    return enqueue(order_id) if enqueue is not None else task.delay(order_id)


class OrderRefused(Exception):
    """The order failed validation after its tasks were published: it rolls back."""


def place_order(*, tenant, email, sku, quantity, total_cents, copies=1, refuse=False):
    """Create the order and publish each of its tasks ``copies`` times (a producer that
    retries, a double click); returns the order's id."""
    with transaction.atomic():
        order = Order.objects.create(tenant=tenant, email=email, sku=sku, quantity=quantity,
                                     total_cents=total_cents)
        for _ in range(copies):
            for task in TASKS:
                publish(task, order.pk)
        if refuse:
            raise OrderRefused(f"order {order.pk} refused")
    return order.pk
