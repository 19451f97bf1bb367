"""A SQLite project has no PostgreSQL driver: the app must start and run without one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
sys.modules["psycopg"] = None   # an import of either driver now raises ImportError
sys.modules["psycopg2"] = None
import django
django.setup()
import celery_idem.recovery.sweep, celery_idem.admin, celery_idem.testing, celery_idem.checks
from django_app.effects.tasks import ship_order
print(ship_order.intent((1,)).key)
"""


def test_the_app_starts_without_a_postgresql_driver(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "django_app.settings",
           "IDEM_DATABASE": "sqlite", "IDEM_VAR_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("IDEM_BROKER", None)
    env.pop("IDEM_RESULTS", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ship/1")
