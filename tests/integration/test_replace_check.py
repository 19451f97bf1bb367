"""A worker without ``celery_idem.tasks`` (``celery_idem.replaced`` unregistered) fails a
body's ``self.replace()`` at once with an error naming the fix, instead of leaving the
key waiting for a last step no worker runs."""

from __future__ import annotations

import pytest

from celery_idem import ConfigurationError
from celery_idem.models import Job
from django_app.effects.path_tasks import replaced_body

from .jobs import TIMEOUT
from .workers import Worker, purge_queue, worker_env


@pytest.fixture
def worker_without_library_tasks(broker_service, transactional_db):
    purge_queue()
    with Worker(env=worker_env(IDEM_WITHOUT_LIBRARY_TASKS="1")) as w:
        yield w


def test_replace_fails_loudly_on_a_worker_without_celery_idem_tasks(
        worker_without_library_tasks):
    with pytest.raises(ConfigurationError, match="celery_idem.tasks") as failed:
        replaced_body.delay(77).get(timeout=TIMEOUT)
    job = Job.objects.get(key="replace/77")
    assert job.state == "FAILED" and "autodiscover_tasks" in str(job.error)
    # A duplicate replays the stored failure, as the first caller's error.
    with pytest.raises(ConfigurationError) as replayed:
        replaced_body.delay(77).get(timeout=TIMEOUT)
    assert replayed.value.args == failed.value.args
