"""PER_CALL tasks shaped like those of Celery's own integration suite (t/integration/
tasks.py): the messages Celery itself publishes for them (chain links, chord bodies,
link callbacks, group members) must get their keys without the caller's help."""

from __future__ import annotations

import os

from celery import group, shared_task

from celery_idem import ALL_ARGUMENTS, PER_CALL, IdempotentTask

from .models import Effect


def _effect(task, **value) -> Effect:
    """The body's effect, under its key (``"no-key"``: applied eagerly without one)."""
    return Effect.objects.create(key=task.idempotency_key or "no-key", value=value,
                                 attempt=task.attempt, pid=os.getpid())


@shared_task(base=IdempotentTask, bind=True, idempotency_key=PER_CALL)
def add_per_call(self, x, y):
    _effect(self, x=x, y=y)
    return x + y


@shared_task(base=IdempotentTask, bind=True, idempotency_key=PER_CALL)
def sum_per_call(self, numbers):
    """A chord's callback: the sum of the header's results."""
    _effect(self, numbers=numbers)
    return sum(numbers)


@shared_task(base=IdempotentTask, bind=True, idempotency_key=PER_CALL, max_retries=1,
             default_retry_delay=0)
def retry_with_new_arguments(self, n, seen=0):
    """Celery's test_retry_switches_from_kwargs_to_args: the first attempt retries with
    its arguments changed (keyword to positional, ``seen`` set), the second returns."""
    _effect(self, n=n, seen=seen)
    if not seen:
        raise self.retry(args=(n, 1), kwargs={}, countdown=0)
    return n * 10


@shared_task(base=IdempotentTask, bind=True, idempotency_key=ALL_ARGUMENTS, max_retries=1,
             default_retry_delay=0)
def retry_all_arguments(self, n, seen=0):
    """As retry_with_new_arguments, keyed by its arguments: the key stays the first call's."""
    _effect(self, n=n, seen=seen)
    if not seen:
        raise self.retry(kwargs={"n": n, "seen": 1}, args=(), countdown=0)
    return n * 10


@shared_task(base=IdempotentTask, bind=True, idempotency_key=ALL_ARGUMENTS, typing=False)
def add_untyped(self, x, y):
    """Celery's add_not_typed: its arguments are not checked at publish."""
    _effect(self, x=x, y=y)
    return x + y


@shared_task(base=IdempotentTask, bind=True, idempotency_key=PER_CALL)
def fail_per_call(self, n):
    _effect(self, n=n)
    raise ValueError(f"failed {n}")


@shared_task(base=IdempotentTask, bind=True, idempotency_key=PER_CALL)
def errback_per_call(self, task_id):
    """A link_error callback in Celery's one-argument form: the failed task's id."""
    _effect(self, failed=task_id)
    return task_id


@shared_task(base=IdempotentTask, bind=True, idempotency_key=PER_CALL)
def start_chain(self):
    """Celery's build_chain_inside_task: returns the AsyncResult of a canvas it started,
    which Celery's result backend stores as its tuple."""
    _effect(self)
    return (add_per_call.s(1, 1) | add_per_call.s(2)
            | group(add_per_call.s(3), add_per_call.s(4)) | sum_per_call.s())()


@shared_task(base=IdempotentTask, bind=True, idempotency_key="replaced-per-call/{n}")
def replaced_by_per_call(self, n):
    """Replaces itself with a PER_CALL task sent without a key (derived from this job)."""
    _effect(self, n=n)
    return self.replace(add_per_call.s(n, n))
