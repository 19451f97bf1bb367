"""The test project's settings plus the recovery schedule as the docs recommend it
(``recovery_schedule()``, every 10 s), for the ``celery beat`` of
tests/integration/test_liveness.py's run with the default liveness settings."""

from celery_idem.beat import recovery_schedule
from django_app.settings import *  # noqa: F403

CELERY_BEAT_SCHEDULE = {**recovery_schedule()}
