"""PER_CALL tasks shaped like those of Celery's own integration suite (t/integration/
tasks.py): the messages Celery itself publishes for them (chain links, chord bodies,
link callbacks, group members) must get their keys without the caller's help."""

from __future__ import annotations

from celery import shared_task

from celery_idem import PER_CALL, IdempotentTask

from .tasks import _effect


@shared_task(base=IdempotentTask, bind=True, idempotency_key=PER_CALL)
def add_per_call(self, x, y):
    _effect(self, x=x, y=y)
    return x + y


@shared_task(base=IdempotentTask, bind=True, idempotency_key=PER_CALL)
def sum_per_call(self, numbers):
    """A chord's callback: the sum of the header's results."""
    _effect(self, numbers=numbers)
    return sum(numbers)
