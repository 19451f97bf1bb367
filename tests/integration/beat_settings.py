"""The test project's settings plus the recovery schedule, for ``celery beat`` processes
(tests/integration/test_beat.py): the one line a project adds."""

from celery_idem.beat import recovery_schedule
from django_app.settings import *  # noqa: F403

CELERY_BEAT_SCHEDULE = {**recovery_schedule(interval=1)}
