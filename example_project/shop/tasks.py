import time

from celery import shared_task

from celery_idem import IdempotentTask

from .models import Payment


@shared_task(base=IdempotentTask, bind=True, atomic=True, idempotency_key="charge/{order_id}")
def charge_order(self, order_id, amount_cents):
    """Charge an order. atomic=True: the Payment row and the job's commit are one
    transaction, so the charge exists exactly once whatever is redelivered."""
    time.sleep(0.2)  # a slow provider, so duplicates arrive while the first one runs
    Payment.objects.create(order_id=order_id, amount_cents=amount_cents, attempt=self.attempt)
    return {"order_id": order_id, "charged": amount_cents}
