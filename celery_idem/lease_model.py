"""The lease row behind ``celery_idem.leases``: one per name, holding its fencing token.

Kept in its own module (imported from ``models.py``) so the job tables and the leases
change independently.
"""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

#: Length of the name column; longer names are refused by ``leases.acquire``.
NAME_MAX_LENGTH = 255
#: Length of the holder column (host name, pid and thread id of a pool process).
HOLDER_MAX_LENGTH = 255


class Lease(models.Model):
    """A named lease: who holds it, until when, and the fencing token of that holding."""

    name = models.CharField(_("name"), max_length=NAME_MAX_LENGTH, unique=True)
    holder = models.CharField(_("holder"), max_length=HOLDER_MAX_LENGTH)
    token = models.BigIntegerField(
        _("fencing token"), default=1,
        help_text=_("grows on every acquisition and never goes back"),
    )
    expires_at = models.DateTimeField(_("expires at"))
    acquired_at = models.DateTimeField(_("acquired at"), default=timezone.now)
    renewed_at = models.DateTimeField(_("renewed at"), default=timezone.now)
    # A coordinator tick that met another holder's live lease is counted, not run.
    skipped_ticks = models.PositiveBigIntegerField(
        _("skipped ticks"), default=0,
        help_text=_("ticks other workers skipped because this lease was held"),
    )
    last_skipped_at = models.DateTimeField(_("last skipped at"), null=True, blank=True)

    class Meta:
        verbose_name = _("lease")
        verbose_name_plural = _("leases")

    def __str__(self) -> str:
        return f"{self.name} [{self.holder} #{self.token}]"

    def is_live(self, now: datetime | None = None) -> bool:
        """Whether the lease has not expired at ``now`` (default: the current time)."""
        return self.expires_at > (now or timezone.now())
