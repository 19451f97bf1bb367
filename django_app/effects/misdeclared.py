"""A task declared without an idempotency key, on purpose, for the test that shows one
mistake stays local (tests/integration/test_misdeclared.py): not a ``tasks`` module, so
nothing imports it unless asked (a worker with ``-I django_app.effects.misdeclared``)."""

from __future__ import annotations

from celery import shared_task

from celery_idem import IdempotentTask

from .models import Effect


@shared_task(base=IdempotentTask, bind=True)
def no_key(self, n):
    Effect.objects.create(key=f"misdeclared/{n}", value={"n": n}, attempt=0, pid=0)
    return n
