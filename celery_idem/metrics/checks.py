"""System checks for the metrics settings (docs/reference/checks.md lists each id and its fix)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from ..check_ids import CHECKS
from ..checks import TAG
from ..conf import settings
from ..errors import ConfigurationError
from . import BACKENDS, available, enabled


@checks.register(TAG)
def check_metrics(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E021: a backend whose library is missing; W020: an exporter port without
    Prometheus. (An unknown backend is E020, a bad port E012: ``checks_settings``.)"""
    messages: list[checks.CheckMessage] = []
    try:
        names = enabled()
        port = settings.METRICS_PORT
    except ConfigurationError:
        return messages
    for name in names:
        if not available(name):
            messages.append(CHECKS["E021"](
                f"CELERY_IDEM_METRICS enables {name!r}, but {BACKENDS[name][0]} is not "
                "installed: no metrics are recorded",
                hint=f"{BACKENDS[name][1]}, or remove {name!r} from CELERY_IDEM_METRICS."))
    if port and "prometheus" not in names:
        messages.append(CHECKS["W020"](
            "CELERY_IDEM_METRICS_PORT is set but CELERY_IDEM_METRICS does not enable "
            "'prometheus': no exporter is started",
            hint="Set CELERY_IDEM_METRICS = 'prometheus', or remove the port."))
    return messages
