from django.db import models


class Payment(models.Model):
    """A charge at the (pretend) payment provider: the effect that must happen once."""

    order_id = models.IntegerField()
    amount_cents = models.IntegerField()
    attempt = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
