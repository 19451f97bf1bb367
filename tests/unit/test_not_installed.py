"""A project that imports celery-idem but left it out of INSTALLED_APPS hears so from
``manage.py check`` and from ``delay()``, each naming the fix. Each case runs in a
process of its own: this one has the app installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

#: A project as a new user writes it, minus "celery_idem" in INSTALLED_APPS; its
#: settings import celery_idem.beat, as the README's do.
PROJECT = """
import sys
import django
from django.conf import settings

from celery_idem.beat import recovery_schedule

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth"],
    DATABASES={{"default": {{"ENGINE": "django.db.backends.sqlite3",
                             "NAME": {database!r}}}}},
    USE_TZ=True, CELERY_BROKER_URL="memory://",
    CELERY_BEAT_SCHEDULE=recovery_schedule(interval=60),
)
django.setup()
from celery import Celery
from django.core.management import call_command

from celery_idem import IdempotentTask

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.task(base=IdempotentTask, idempotency_key="ship/{{order_id}}")
def ship(order_id):
    return order_id


if sys.argv[1] == "check":
    call_command("check")
else:
    ship.delay(1)
"""
FIX = 'Add "celery_idem" to INSTALLED_APPS, then run manage.py migrate.'


def _run(tmp_path: Path, what: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "proj.py"
    script.write_text(textwrap.dedent(PROJECT.format(database=str(tmp_path / "db.sqlite3"))))
    return subprocess.run([sys.executable, str(script), what], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


def test_check_reports_the_missing_app_with_the_fix(tmp_path):
    done = _run(tmp_path, "check")
    assert done.returncode != 0
    assert "celery_idem.E006" in done.stderr
    assert FIX in done.stderr


def test_delay_without_the_app_raises_configuration_error_naming_the_fix(tmp_path):
    done = _run(tmp_path, "delay")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("celery_idem.errors.ConfigurationError: ")
    assert FIX in last
