"""What a task body sees on ``self``: the names IdempotentTask reserves."""

from __future__ import annotations

import pytest
from celery import Celery, chain
from celery.exceptions import ImproperlyConfigured

from celery_idem import ALL_ARGUMENTS, IdempotentTask
from celery_idem.claims import Claim
from celery_idem.errors import ReservedAttribute
from celery_idem.replacement import REPLACED_TASK

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


def passed_on(result, alias, job_id, attempt):
    return result


def replace_with_nothing(self):
    return self.replace(chain())


def test_replacing_a_claimed_body_with_an_empty_chain_is_celerys_error():
    """Celery refuses an empty chain as a replacement (ImproperlyConfigured); a claimed
    body gets that refusal, not a chain of the replacement's last step alone (which then
    failed on the worker with a TypeError for its missing arguments)."""
    task = app.task(base=IdempotentTask, bind=True, lazy=False, shared=False,
                    name="t.surface.replace", idempotency_key=ALL_ARGUMENTS)(
                        replace_with_nothing)
    # The replacement's last step, as a worker that imported celery_idem.tasks has it.
    app.task(name=REPLACED_TASK, lazy=False, shared=False)(passed_on)
    claim = Claim(None, 7, 1, "w", "t-7", 0)  # type: ignore[arg-type]
    task.push_request(id="t-7", is_eager=False, _idem_claim=claim)
    try:
        with pytest.raises(ImproperlyConfigured, match="Cannot replace with an empty chain"):
            task.run()
    finally:
        task.pop_request()
