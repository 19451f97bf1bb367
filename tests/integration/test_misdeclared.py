"""One misdeclared task stays local: a task declared without ``idempotency_key`` is
refused by name (check E001, its own publishes, its own messages on the worker) while the
worker starts and every other task publishes and runs."""

from __future__ import annotations

import pytest
from celery import current_app

from celery_idem import checks
from celery_idem.errors import ConfigurationError
from celery_idem.models import Job
from django_app.effects.models import Effect
from django_app.effects.tasks import ship_order

from .workers import Worker, purge_queue

TIMEOUT = 90
NAME = "django_app.effects.misdeclared.no_key"


@pytest.fixture
def forgotten_afterwards():
    """The misdeclared task leaves this process's app after the test (later checks of the
    project's tasks must not meet it)."""
    yield
    current_app.tasks.pop(NAME, None)


def test_a_misdeclared_task_is_refused_by_name_and_the_others_run(broker_service,
                                                                   transactional_db,
                                                                   forgotten_afterwards):
    """The worker imports the misdeclared task and starts; its message (sent by name from
    a producer that does not know it) fails on the worker with the declaration's error,
    logged and stored as the task's result, without running or writing a row; then, in a
    producer that imports it, its delay() raises naming it, every other task's works, and
    check E001 names it."""
    purge_queue()
    with Worker(concurrency=1, extra_args=("-I", "django_app.effects.misdeclared")) as w:
        refused = current_app.send_task(NAME, args=[1])
        with pytest.raises(ConfigurationError, match=f"{NAME} declares no idempotency_key"):
            refused.get(timeout=TIMEOUT)
        assert ship_order.delay(3701).get(timeout=TIMEOUT)["shipped"] == 3701
        log = w.log()
    assert f"Task {NAME}[{refused.id}] raised unexpected: ConfigurationError" in log
    assert not Effect.objects.filter(key__startswith="misdeclared/").exists()
    assert not Job.objects.filter(task_name=NAME).exists()

    from django_app.effects import misdeclared  # its creation raises nothing

    with pytest.raises(ConfigurationError, match=f"{NAME} declares no idempotency_key"):
        misdeclared.no_key.delay(2)
    assert not Job.objects.filter(task_name=NAME).exists()
    assert ship_order.delay(3702).id  # the app finalized: every other task publishes
    messages = [m for m in checks.check_tasks() if NAME in m.msg]
    assert [m.id for m in messages] == ["celery_idem.E001"]
