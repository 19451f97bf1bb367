"""Reading jobs back in integration tests, and the clock of a recovery pass after a crash."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from celery_idem.conf import settings as idem_settings
from celery_idem.models import Job, Transition

#: Seconds an integration test waits for a worker to get somewhere.
TIMEOUT = 120


def later() -> datetime:
    """A clock past every lease and dispatch timeout: the claims of killed workers are
    stale. Move the clock this far only while no live worker can claim."""
    return timezone.now() + timedelta(
        seconds=idem_settings.DEFAULT_LEASE + idem_settings.DISPATCH_TIMEOUT + 60)


def job(key: str) -> Job:
    return Job.objects.get(key=key)


def events(key: str) -> list[str]:
    """The events of ``key``'s history, in order."""
    return list(Transition.objects.filter(job__key=key).order_by("id")
                .values_list("event", flat=True))
