"""A producer whose broker refuses a message as too large, then recovery passes on the
same broker (run by test_large_arguments in its own process, with its own broker URL)."""

from __future__ import annotations

import json
import sys
from datetime import timedelta


def main(size: int) -> None:
    import django

    django.setup()
    from django.test import override_settings
    from django.utils import timezone

    from celery_idem.conf import settings as idem_settings
    from celery_idem.recovery import sweep
    from django_app.effects.tasks import add

    try:
        add.delay("x" * size, "!")
        raised = ""
    except Exception as exc:  # the broker's error, whatever its client calls it
        raised = type(exc).__name__
    # No worker consumes this broker, so moving the recovery pass's clock claims nothing.
    clock, reports = timezone.now(), []
    with override_settings(CELERY_IDEM_MAX_REDISPATCHES=2):
        for _ in range(4):
            clock += timedelta(seconds=idem_settings.DISPATCH_MAX_BACKOFF + 1)
            reports.append(sweep.reap(now=clock).as_dict())
    print(json.dumps({"raised": raised, "reports": reports}))


if __name__ == "__main__":
    main(int(sys.argv[1]))
