"""The Django app: connects the Celery hooks once Django is ready."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CeleryIdemConfig(AppConfig):
    name = "celery_idem"
    label = "celery_idem"
    verbose_name = _("Idempotent tasks")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, hooks  # noqa: F401 - importing checks registers them

        hooks.connect()
