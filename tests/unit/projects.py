"""A throwaway Django project with celery-idem, written to a folder and checked with
``manage.py check`` in a fresh process, as a user's project would be (the check tests of
tests/unit/test_checks.py and test_tasks_backend.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def project_files(name: str, settings: str = "") -> dict[str, str]:
    """Project ``name``: a Celery app that autodiscovers tasks, and settings with
    ``celery_idem`` and an app ``shop`` installed (its files are the caller's), SQLite,
    the in-memory broker, then ``settings``."""
    return {
        f"{name}/__init__.py": "from .celery import app as celery_app\n",
        f"{name}/celery.py": (
            "import os\nfrom celery import Celery\n"
            f"os.environ.setdefault('DJANGO_SETTINGS_MODULE', '{name}.settings')\n"
            f"app = Celery('{name}')\n"
            "app.config_from_object('django.conf:settings', namespace='CELERY')\n"
            "app.autodiscover_tasks()\n"
        ),
        f"{name}/settings.py": (
            "SECRET_KEY = 'x'\nUSE_TZ = True\n"
            "INSTALLED_APPS = ['django.contrib.contenttypes', 'celery_idem', 'shop']\n"
            "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', 'NAME': 'db',\n"
            "    'OPTIONS': {'timeout': 30, 'transaction_mode': 'IMMEDIATE',\n"
            "                'init_command': 'PRAGMA journal_mode=WAL;'}}}\n"
            "CELERY_BROKER_URL = 'memory://'\n"
            "CELERY_TASK_ACKS_LATE = True\nCELERY_TASK_REJECT_ON_WORKER_LOST = True\n"
            + settings
        ),
        "shop/__init__.py": "",
    }


def manage_py_check(folder: Path, files: dict[str, str],
                    name: str) -> subprocess.CompletedProcess[str]:
    """Write ``files`` under ``folder`` and run ``manage.py check`` on project ``name``."""
    for path, text in files.items():
        (folder / path).parent.mkdir(exist_ok=True)
        (folder / path).write_text(text)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": f"{name}.settings",
           "PYTHONPATH": f"{folder}{os.pathsep}{ROOT}"}
    return subprocess.run([sys.executable, "-m", "django", "check"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)
