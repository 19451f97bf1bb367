"""Rows the test and benchmark tasks write, so tests can count effects."""

from django.db import models


class Effect(models.Model):
    """One side effect of a task body: which key, which attempt, which process."""

    key = models.CharField(max_length=255, db_index=True)
    value = models.JSONField(null=True)
    attempt = models.PositiveIntegerField(null=True)
    pid = models.IntegerField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)
