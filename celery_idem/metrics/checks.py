"""System checks for the metrics settings (docs/reference/checks.md lists each id and its fix)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from ..checks import TAG
from ..conf import settings
from . import BACKENDS, available, enabled


@checks.register(TAG)
def check_metrics(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E020: an unknown backend; E021: a backend whose library is missing; W020: an
    exporter port without Prometheus."""
    messages: list[checks.CheckMessage] = []
    names = enabled()
    for name in names:
        if name not in BACKENDS:
            messages.append(checks.Error(
                f"CELERY_IDEM_METRICS names {name!r}, which is not a metrics backend",
                hint=f"Use one of {', '.join(map(repr, BACKENDS))}, a list of them, or None.",
                id="celery_idem.E020"))
        elif not available(name):
            messages.append(checks.Error(
                f"CELERY_IDEM_METRICS enables {name!r}, but {BACKENDS[name][0]} is not "
                "installed: no metrics are recorded",
                hint=f"{BACKENDS[name][1]}, or remove {name!r} from CELERY_IDEM_METRICS.",
                id="celery_idem.E021"))
    if settings.METRICS_PORT and "prometheus" not in names:
        messages.append(checks.Warning(
            "CELERY_IDEM_METRICS_PORT is set but CELERY_IDEM_METRICS does not enable "
            "'prometheus': no exporter is started",
            hint="Set CELERY_IDEM_METRICS = 'prometheus', or remove the port.",
            id="celery_idem.W020"))
    return messages
