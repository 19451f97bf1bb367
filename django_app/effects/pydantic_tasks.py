"""Celery's ``pydantic=True`` tasks as idempotent ones (tests/integration/test_pydantic.py):
models in, a model out. Imported by ``tasks`` only where pydantic is installed."""

from __future__ import annotations

import os

from celery import shared_task
from pydantic import BaseModel

from celery_idem import PER_CALL, IdempotentTask

from .models import Effect


class Numbers(BaseModel):
    x: int
    y: int


class Total(BaseModel):
    total: int


@shared_task(base=IdempotentTask, bind=True, idempotency_key=PER_CALL, pydantic=True)
def add_models(self, numbers: Numbers) -> Total:
    Effect.objects.create(key=self.idempotency_key, value=numbers.model_dump(),
                          attempt=self.attempt, pid=os.getpid())
    return Total(total=numbers.x + numbers.y)
