"""Rows the test and benchmark tasks write, so tests can count effects."""

from django.db import models


class Effect(models.Model):
    """One side effect of a task body: which key, which attempt, which process."""

    key = models.CharField(max_length=255, db_index=True)
    value = models.JSONField(null=True)
    attempt = models.PositiveIntegerField(null=True)
    pid = models.IntegerField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)


class Stock(models.Model):
    """Units on hand of one product (the check-then-act recipe deducts from it)."""

    sku = models.CharField(max_length=64, unique=True)
    quantity = models.IntegerField()


class StockDeduction(models.Model):
    """That an order's units of a product were taken: the record the recipe checks first."""

    order_id = models.IntegerField()
    sku = models.CharField(max_length=64)
    quantity = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["order_id", "sku"], name="effects_deduction_once"),
        ]


class ChaosWrite(models.Model):
    """The chaos suite's atomic effect: one row per job, written in the job's transaction."""

    key = models.CharField(max_length=255, db_index=True)
    attempt = models.PositiveIntegerField()
    pid = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
