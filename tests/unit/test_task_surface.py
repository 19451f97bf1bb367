"""What a task body sees on ``self``: the names IdempotentTask reserves."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_idem import ALL_ARGUMENTS, IdempotentTask
from celery_idem.errors import ReservedAttribute

app = Celery("task-surface-tests", set_as_current=False)


def count(self, n):
    self.attempt = n  # what Celery's own integration suite's ``retry`` task does


def test_setting_attempt_names_it_the_claims_fencing_token_and_the_way_out():
    task = app.task(base=IdempotentTask, bind=True, lazy=False, shared=False,
                    name="t.surface.attempt", idempotency_key=ALL_ARGUMENTS)(count)
    with pytest.raises(ReservedAttribute, match="fencing token.*counter of your own"):
        task.attempt = 2
    assert task.attempt is None  # no claim outside a running body; nothing was set
    with pytest.raises(AttributeError):  # still what getattr/hasattr code expects
        task.attempt = 3
