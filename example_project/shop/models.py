"""The shop: orders, stock, and a record of every effect the tasks in shop/tasks.py have."""

from django.db import models


class Order(models.Model):
    tenant = models.CharField(max_length=20)
    email = models.EmailField()
    sku = models.CharField(max_length=20)
    quantity = models.PositiveIntegerField()
    total_cents = models.PositiveIntegerField()
    charge_id = models.CharField(max_length=40, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order {self.pk} ({self.tenant})"


class Product(models.Model):
    sku = models.CharField(max_length=20, unique=True)
    quantity = models.IntegerField()

    def __str__(self) -> str:
        return f"{self.sku}: {self.quantity}"


class StockDeduction(models.Model):
    """One per order: written with the stock change in the job's transaction."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    sku = models.CharField(max_length=20)
    quantity = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField()


class Shipment(models.Model):
    """The warehouse's record, upserted by order: writing it twice changes nothing."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    warehouse = models.CharField(max_length=20)
    address = models.CharField(max_length=200)
    #: How many times the upsert ran (a repeat after a crash adds one, and no row).
    writes = models.PositiveIntegerField(default=0)


class SentEmail(models.Model):
    """Every message the e-mail backend was given (shop.mail.RecordingBackend): the
    effect that is not idempotent, as an SMTP server's is."""

    to = models.CharField(max_length=200)
    subject = models.CharField(max_length=200)
    body = models.TextField()
    key = models.CharField(max_length=255, blank=True, default="")
    attempt = models.PositiveIntegerField(default=0)
    worker = models.CharField(max_length=200, blank=True, default="")
    sent_at = models.DateTimeField(auto_now_add=True)


class OcrRun(models.Model):
    """One run of the (costly) OCR step of an order's attachment."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE)
    attempt = models.PositiveIntegerField()
    worker = models.CharField(max_length=200)
    at = models.DateTimeField(auto_now_add=True)


class SearchEntry(models.Model):
    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    text = models.TextField()


class TenantReport(models.Model):
    """A coordinator's write, fenced by its lease token (shop.tasks.coordinate_tenant)."""

    tenant = models.CharField(max_length=20)
    token = models.PositiveBigIntegerField()
    holder = models.CharField(max_length=200)
    paid_orders = models.PositiveIntegerField()
    at = models.DateTimeField(auto_now_add=True)
