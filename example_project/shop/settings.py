"""The shop's settings, as a project using celery-idem would write them.

With nothing set it runs embedded: SQLite in WAL mode and celery-idem's filesystem
transport, no server to start. The environment points it elsewhere (the demo sets these):

- ``SHOP_DATABASE``: ``sqlite`` (default) or a URL ``postgres://user@host:port/name``.
- ``SHOP_BROKER``: a broker URL (default ``filesystem://``), e.g. ``redis://127.0.0.1:6379/5``.
- ``SHOP_RESULTS``: a result backend URL (default: a folder under var/, the Redis broker's
  URL on Redis, ``rpc://`` on RabbitMQ).
- ``SHOP_QUEUE``: the queue the shop's tasks go to (default ``shop``).
- ``SHOP_VAR``: where SQLite, the filesystem broker and the demo's files live (default
  ``example_project/var``).
- ``SHOP_PROVIDER_URL``: the payment provider's base URL (the demo starts a fake one).
"""

import os
from pathlib import Path
from urllib.parse import urlparse

import django

from celery_idem.beat import recovery_schedule

VAR = Path(os.environ.get("SHOP_VAR", Path(__file__).resolve().parent.parent / "var"))
VAR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = "demo-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
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
    "celery_idem",  # its admin pages (jobs, leases) register themselves
    "shop",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "shop.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
STATIC_URL = "static/"

# -- Database ----------------------------------------------------------------------------
_database = os.environ.get("SHOP_DATABASE", "sqlite")
if _database == "sqlite":
    # A file (worker processes share it), WAL so readers never wait for the writer,
    # IMMEDIATE so a transaction that reads then writes waits for the lock instead of
    # failing, and a busy timeout longer than any transaction (celery-idem's checks
    # W003-W005 ask for these).
    _sqlite = {"timeout": 30, "transaction_mode": "IMMEDIATE",
               "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"}
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                             "NAME": str(VAR / "shop.sqlite3"), "OPTIONS": _sqlite}}
else:
    _url = urlparse(_database)
    if _url.scheme not in ("postgres", "postgresql"):
        raise RuntimeError(f"SHOP_DATABASE must be sqlite or postgres://..., not {_database!r}")
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": _url.path.lstrip("/") or "shop",
        "USER": _url.username or "postgres", "PASSWORD": _url.password or "",
        "HOST": _url.hostname or "127.0.0.1", "PORT": str(_url.port or 5432),
    }}

# -- E-mail: each message is a row of shop.SentEmail (shop/mail.py) -----------------------
EMAIL_BACKEND = "shop.mail.RecordingBackend"
DEFAULT_FROM_EMAIL = "orders@shop.example"

# -- Celery ------------------------------------------------------------------------------
CELERY_BROKER_URL = os.environ.get("SHOP_BROKER", "filesystem://")
_scheme = urlparse(CELERY_BROKER_URL).scheme
if _scheme == "filesystem":
    # kombu's own filesystem transport can lose a message to a half-written file;
    # celery-idem's writes each message atomically and creates its folders.
    _broker = VAR / "broker"
    CELERY_BROKER_TRANSPORT = "celery_idem.filesystem:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker / "queue"),
        "data_folder_out": str(_broker / "queue"),
        "processed_folder": str(_broker / "processed"),
        "control_folder": str(_broker / "control"),
        # How long a worker sleeps when it finds no message it can take. It also sleeps
        # this long whenever its prefetch is full, so after each task: 0.1 s (Celery's
        # default is 1 s) would leave each pool child idle a good part of the time.
        "polling_interval": 0.02,
    }
    CELERY_WORKER_ENABLE_REMOTE_CONTROL = False  # the transport has no broadcast
    (VAR / "results").mkdir(exist_ok=True)
    _results = f"file://{VAR / 'results'}"
elif _scheme == "redis":
    _results = CELERY_BROKER_URL
else:
    _results = "rpc://"
# The result backend serves AsyncResult.get(); celery-idem's job rows are the source of
# truth either way (a duplicate replays the stored result).
CELERY_RESULT_BACKEND = os.environ.get("SHOP_RESULTS", _results)
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("SHOP_QUEUE", "shop")
if django.VERSION >= (6, 0):
    # Django's Tasks framework on these workers, each task once per key (shop.tasks.ship_order).
    TASKS = {"default": {"BACKEND": "celery_idem.tasks_backend.CeleryIdemBackend"}}

# The recommended worker settings (docs/tutorial/add-to-a-project.md):
# acknowledge after the body, requeue a message whose pool child died, take one message
# at a time, JSON only.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Keep each pool child's database connection across tasks (Celery's Django fixup would
# close it around every task); celery-idem closes it after a task that failed or was
# interrupted (docs/how-to/worker-connections.md).
CELERY_IDEM_WORKER_CONNECTIONS = "keep"
DATABASES["default"]["CONN_MAX_AGE"] = 300
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

TENANTS = ["north", "south", "east"]
# Beat: the recovery pass, and one coordinator tick per tenant (shop.tasks), on a queue
# of their own so that a backlog of orders never delays recovery (workers consume both).
CONTROL_QUEUE = f"{CELERY_TASK_DEFAULT_QUEUE}-control"
CELERY_BEAT_SCHEDULE = {
    **recovery_schedule(interval=1, queue=CONTROL_QUEUE),
    **{f"coordinate-{tenant}": {"task": "shop.tasks.coordinate_tenant", "schedule": 1.0,
                                "args": (tenant,),
                                "options": {"queue": CONTROL_QUEUE, "expires": 1}}
       for tenant in TENANTS},
}

# -- Demo tuning -------------------------------------------------------------------------
# The demo kills workers and wants every crash recovered within a one-minute run, so
# its leases and timeouts are seconds where production uses minutes: a claim lives 6 s
# (default 3600), a message nobody claimed is presumed lost after 5 s (default 600), and
# the recovery pass above runs every second (production: 60 s). A duplicate that meets a
# running attempt re-checks after 0.25 s (default 1 s).
CELERY_IDEM_DEFAULT_LEASE = 6
CELERY_IDEM_LEASE_GRACE = 2
CELERY_IDEM_DISPATCH_TIMEOUT = 5
CELERY_IDEM_DISPATCH_MAX_BACKOFF = 10
CELERY_IDEM_IN_PROGRESS_BACKOFF = 0.25
CELERY_IDEM_IN_PROGRESS_MAX_BACKOFF = 2
SHOP_PROVIDER_URL = os.environ.get("SHOP_PROVIDER_URL", "http://127.0.0.1:8765")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"celery_idem": {"handlers": ["console"], "level": "WARNING"}},
}
