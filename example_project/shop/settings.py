"""The demo's settings: SQLite in WAL mode and kombu's filesystem transport, no servers."""

from pathlib import Path

import django

VAR = Path(__file__).resolve().parent.parent / "var"
BROKER = VAR / "broker"
for folder in (BROKER / "queue", BROKER / "processed", BROKER / "control", VAR / "results"):
    folder.mkdir(parents=True, exist_ok=True)

SECRET_KEY = "demo-only"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "celery_idem", "shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_sqlite = {"timeout": 30}
if django.VERSION >= (5, 1):
    _sqlite |= {"init_command": "PRAGMA journal_mode=WAL;", "transaction_mode": "IMMEDIATE"}
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(VAR / "shop.sqlite3"),
                "OPTIONS": _sqlite}
}

CELERY_BROKER_URL = "filesystem://"
# kombu's own filesystem transport can lose a message to a half-written file.
CELERY_BROKER_TRANSPORT = "celery_idem.filesystem:Transport"
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "data_folder_in": str(BROKER / "queue"),
    "data_folder_out": str(BROKER / "queue"),
    "processed_folder": str(BROKER / "processed"),
    "control_folder": str(BROKER / "control"),
    "polling_interval": 0.1,
}
CELERY_RESULT_BACKEND = f"file://{VAR / 'results'}"
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
