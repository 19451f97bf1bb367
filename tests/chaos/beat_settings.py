"""Settings of the chaos suite's ``celery beat``: the test project's, plus the recovery
pass every ``CHAOS_RECOVERY_INTERVAL`` seconds on the queue ``CHAOS_RECOVERY_QUEUE``
(its own, so a backlog of work does not delay recovery)."""

import os

from celery_idem.beat import recovery_schedule
from django_app.settings import *  # noqa: F403

CELERY_BEAT_SCHEDULE = recovery_schedule(
    interval=float(os.environ.get("CHAOS_RECOVERY_INTERVAL", "2")),
    queue=os.environ["CHAOS_RECOVERY_QUEUE"])
