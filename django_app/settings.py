"""Settings for the development/test project. The database and broker come from the
environment; with nothing set it runs embedded: SQLite in WAL mode and kombu's
filesystem transport, no server to start.

- ``IDEM_DATABASE``: ``sqlite`` (default), ``postgres`` (``IDEM_PG_NAME``, default
  ``idem``; ``IDEM_PG_HOST`` default 127.0.0.1; user postgres, trust auth) or ``mysql``
  (MariaDB or MySQL: ``IDEM_MYSQL_NAME``, default ``idem``; ``IDEM_MYSQL_HOST`` default
  127.0.0.1, ``IDEM_MYSQL_PORT`` default 3306, user root without a password;
  ``IDEM_MYSQL_DRIVER``: ``mysqlclient``, the default, or ``pymysql``).
- ``IDEM_BROKER``: a broker URL, default ``filesystem://``.
- ``IDEM_RESULTS``: a result backend URL, default a folder under ``IDEM_VAR_DIR``.
- ``IDEM_VAR_DIR``: where SQLite files and the filesystem broker live (default ./var).
- ``IDEM_QUEUE``: the default queue (tests use a fresh one per run).
- ``IDEM_PGBOUNCER=1``: ``IDEM_PG_PORT`` is a PgBouncer in transaction pooling mode
  (tests/services/pgbouncer.py starts one): ``DISABLE_SERVER_SIDE_CURSORS``, as Django
  asks, and ``IDEM_PG_DIRECT_PORT`` (default 5432) is the server itself, where the tests
  create and drop their database (tests/conftest.py).
- ``IDEM_PG_APPLICATION_NAME``: the PostgreSQL ``application_name`` of this process's
  connections; ``IDEM_SQLITE_DJANGO_DEFAULTS=1``: SQLite on Django's default options
  (both for tests that start a worker with them).
"""

import importlib.util
import json
import os
from pathlib import Path

import django

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("IDEM_VAR_DIR", BASE_DIR / "var")).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = "celery-idem-development-only"
DEBUG = os.environ.get("IDEM_DEBUG", "") == "1"
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "celery_idem",
    "django_app.effects",
]
if os.environ.get("IDEM_WITH_RESULTS_APP") == "1":
    INSTALLED_APPS.append("django_celery_results")
if importlib.util.find_spec("django_celery_beat"):
    # The recovery schedule is tested with django-celery-beat's DatabaseScheduler too.
    INSTALLED_APPS.append("django_celery_beat")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "django_app.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "static/"

DATABASE_KIND = os.environ.get("IDEM_DATABASE", "sqlite")
#: Behind PgBouncer (IDEM_PGBOUNCER=1), the PostgreSQL server's own port.
PGBOUNCER = DATABASE_KIND == "postgres" and os.environ.get("IDEM_PGBOUNCER") == "1"
PG_DIRECT_PORT = os.environ.get("IDEM_PG_DIRECT_PORT", "5432")
if DATABASE_KIND == "postgres":
    _name = os.environ.get("IDEM_PG_NAME", "idem")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _name,
            "USER": os.environ.get("IDEM_PG_USER", "postgres"),
            "HOST": os.environ.get("IDEM_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("IDEM_PG_PORT", "5432"),
            "TEST": {"NAME": f"test_{_name}"},
        }
    }
    if PGBOUNCER:
        # Behind a transaction pooler a cursor cannot outlive its transaction's session.
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    if os.environ.get("IDEM_PG_APPLICATION_NAME"):
        # A test finds (and terminates) only one worker's connections by this name.
        DATABASES["default"]["OPTIONS"] = {
            "application_name": os.environ["IDEM_PG_APPLICATION_NAME"]}
elif DATABASE_KIND == "mysql":
    if os.environ.get("IDEM_MYSQL_DRIVER", "mysqlclient") == "pymysql":
        # Django's MySQL backend imports MySQLdb; PyMySQL stands in for it.
        import pymysql

        pymysql.install_as_MySQLdb()
    _name = os.environ.get("IDEM_MYSQL_NAME", "idem")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": _name,
            "USER": os.environ.get("IDEM_MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("IDEM_MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("IDEM_MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("IDEM_MYSQL_PORT", "3306"),
            # utf8mb4 (Django's MySQL default is utf8, three bytes a character); READ
            # COMMITTED is Django's default isolation level there, said out loud because
            # the claim needs it (docs/how-to/mariadb.md).
            "OPTIONS": {"charset": "utf8mb4", "isolation_level": "read committed"},
            # The server's default collation (case-insensitive): celery_idem's migration makes
            # the key columns byte for byte whatever the database's default.
            "TEST": {"NAME": f"test_{_name}", "CHARSET": "utf8mb4"},
        }
    }
    # MariaDB/MySQL have no partial indexes: Django creates them without their condition
    # and warns (models.W037); celery-idem replaces two of them (celery_idem/schema.py).
    SILENCED_SYSTEM_CHECKS = ["models.W037"]
elif DATABASE_KIND == "sqlite":
    # Worker processes must see the test database, so it is a file, never :memory:.
    _options = {"timeout": 30}
    if os.environ.get("IDEM_SQLITE_DJANGO_DEFAULTS") == "1":
        # Django's own defaults: no WAL, a 5 s busy timeout, deferred transactions.
        _options = {}
    else:
        _options |= {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
        }
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(VAR_DIR / "idem.sqlite3"),
            "OPTIONS": _options,
            "TEST": {"NAME": str(VAR_DIR / "test-idem.sqlite3")},
        }
    }
else:
    raise RuntimeError(f"IDEM_DATABASE must be sqlite, postgres or mysql, not {DATABASE_KIND!r}")
if os.environ.get("IDEM_DB_NAME"):
    # Worker processes started by the tests point at the test database by name.
    DATABASES["default"]["NAME"] = os.environ["IDEM_DB_NAME"]

# -- Celery ------------------------------------------------------------------------------
_broker_dir = VAR_DIR / "broker"
CELERY_BROKER_URL = os.environ.get("IDEM_BROKER", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem"):
    # kombu's own filesystem transport can lose a message to a half-written file.
    CELERY_BROKER_TRANSPORT = "celery_idem.filesystem:Transport"
    for sub in ("queue", "processed", "control"):
        (_broker_dir / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "polling_interval": 0.1,
    }
    CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
_results_dir = VAR_DIR / "results"
_results_dir.mkdir(parents=True, exist_ok=True)
CELERY_RESULT_BACKEND = os.environ.get("IDEM_RESULTS", f"file://{_results_dir}")
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("IDEM_QUEUE", "celery")
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Django's Tasks framework (Django 6.0+) on the Celery workers through celery-idem
# (tests/integration/test_django_tasks.py); the worker imports its tasks' module as Celery's
# imports.
if django.VERSION >= (6, 0):
    TASKS = {"default": {"BACKEND": "celery_idem.tasks_backend.CeleryIdemBackend",
                         "QUEUES": ["default", "other"]}}
    CELERY_IMPORTS = ["django_app.effects.django_tasks"]
# The worker connection policy (celery_idem/worker_connections.py); tests switch it.
CELERY_IDEM_WORKER_CONNECTIONS = os.environ.get("IDEM_WORKER_CONNECTIONS", "celery")
# The test tasks include atomic="optimistic" ones on purpose (tests/integration/
# test_optimistic.py): what they give up is known here.
SILENCED_SYSTEM_CHECKS = [*globals().get("SILENCED_SYSTEM_CHECKS", []), "celery_idem.W009"]
if CELERY_IDEM_WORKER_CONNECTIONS == "keep":
    DATABASES["default"]["CONN_MAX_AGE"] = 300  # "keep" honours it: 0 closes every task

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"celery_idem": {"handlers": ["console"], "level": "WARNING"}},
}

# Worker processes started by the tests take celery-idem settings from the environment
# (e.g. CELERY_IDEM_MISSING_INTENT_TIMEOUT=2), as JSON values.
for _name, _value in os.environ.items():
    if _name.startswith("CELERY_IDEM_"):
        globals()[_name] = json.loads(_value)
