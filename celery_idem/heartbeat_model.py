"""The heartbeat row of a running worker, behind worker liveness (``celery_idem.liveness``).

Kept in its own module (imported from ``models.py``) so the job tables and the worker rows
change independently.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

#: Length of the worker column: a claim's worker is this name, "/" and a pid.
WORKER_MAX_LENGTH = 255


class WorkerHeartbeat(models.Model):
    """One worker process, from its start: when it last proved it is alive.

    ``worker`` is the name every claim this worker's pool makes starts with
    (``<name>/<pid>``): recovery releases those claims once ``beat_at`` is older than
    ``CELERY_IDEM_WORKER_TIMEOUT``. Recovery writes one row of its own
    (``recovery.liveness.OBSERVER``): since when it has been watching.
    """

    worker = models.CharField(_("worker"), max_length=WORKER_MAX_LENGTH, unique=True)
    hostname = models.CharField(_("host name"), max_length=WORKER_MAX_LENGTH)
    pid = models.PositiveIntegerField(_("process id"), default=0)
    started_at = models.DateTimeField(_("started at"), default=timezone.now)
    beat_at = models.DateTimeField(_("last beat at"), default=timezone.now)

    class Meta:
        verbose_name = _("worker heartbeat")
        verbose_name_plural = _("worker heartbeats")

    def __str__(self) -> str:
        return f"{self.worker} [{self.beat_at:%Y-%m-%d %H:%M:%S}]"
