"""A minimal Django project using celery-idem as a user's would, written by the wheel test.

Its settings are the README's for the database it is given (SMOKE_DATABASE: postgres,
pgbouncer or mariadb); it reads the database, broker and queue from the environment
(SMOKE_*), so each run has its own. ``smoke_check.py`` publishes one idempotent task
twice, then once more after it finished (a replay), and prints what it saw as JSON: the
results, the job rows, where celery_idem was imported from, and whether the admin page (a
template of the package) and its stylesheet (a static file) are found.
``smoke_recover.py`` runs the recovery pass until a killed worker's job has finished.
"""

from __future__ import annotations

from pathlib import Path

FILES = {
    "manage.py": """\
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "smokeproj.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
""",
    "smokeproj/__init__.py": "from .celery import app as celery_app\n",
    "smokeproj/celery.py": """\
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "smokeproj.settings")
app = Celery("smokeproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
""",
    "smokeproj/settings.py": """\
import os

from celery_idem.beat import recovery_schedule

SECRET_KEY = "smoke-test"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
USE_TZ = True
ROOT_URLCONF = "smokeproj.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages", "django.contrib.staticfiles",
    "celery_idem", "smokeapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
# The README's settings for each database (Add it to your project, step 2).
if os.environ["SMOKE_DATABASE"] == "mariadb":
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.mysql", "NAME": os.environ["SMOKE_DB"],
        "USER": "root", "HOST": "127.0.0.1", "PORT": "3306",
        "OPTIONS": {"charset": "utf8mb4", "isolation_level": "read committed"},
    }}
    SILENCED_SYSTEM_CHECKS = ["models.W037"]
else:
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": os.environ["SMOKE_DB"],
        "USER": "postgres", "HOST": "127.0.0.1", "PORT": os.environ["SMOKE_PORT"],
    }}
    if os.environ["SMOKE_DATABASE"] == "pgbouncer":  # transaction pooling
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
CELERY_BROKER_URL = os.environ["SMOKE_BROKER"]
CELERY_RESULT_BACKEND = os.environ["SMOKE_RESULTS"]
CELERY_TASK_DEFAULT_QUEUE = os.environ["SMOKE_QUEUE"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BEAT_SCHEDULE = {**recovery_schedule()}
# Not the README's: a lease of seconds (the time limit plus this grace), so the test's
# recovery after a killed worker comes in seconds, not minutes.
CELERY_IDEM_LEASE_GRACE = 1
""",
    "smokeproj/urls.py": """\
from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
""",
    "smokeapp/__init__.py": "",
    "smokeapp/tasks.py": """\
import os
import time

from celery import shared_task

from celery_idem import IdempotentTask


@shared_task(base=IdempotentTask, bind=True, idempotency_key="ship/{order_id}")
def ship(self, order_id):
    # The effect: one line per run, appended to a file the test reads.
    with open(os.environ["SMOKE_EFFECTS"], "a") as effects:
        effects.write(f"shipped {order_id}\\n")
    return {"order": order_id}


@shared_task(base=IdempotentTask, bind=True, idempotency_key="pack/{order_id}",
             time_limit=5)
def pack(self, order_id):
    # Says it started, then waits for the test to let it make its effect: the test
    # kills the whole worker in between.
    started = os.environ["SMOKE_EFFECTS"] + ".started"
    with open(started, "a") as marker:
        marker.write(f"attempt {self.attempt}\\n")
    release = os.environ["SMOKE_EFFECTS"] + ".release"
    while not os.path.exists(release):
        time.sleep(0.05)
    with open(os.environ["SMOKE_EFFECTS"], "a") as effects:
        effects.write(f"packed {order_id}\\n")
    return {"packed": order_id}
""",
    "smoke_check.py": """\
import json
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "smokeproj.settings")
django.setup()

import celery_idem  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.contrib.staticfiles import finders  # noqa: E402
from django.test import Client  # noqa: E402

from celery_idem.models import Job  # noqa: E402
from smokeapp.tasks import ship  # noqa: E402

first, second = ship.delay(7), ship.delay(7)
results = [first.get(timeout=90), second.get(timeout=90)]
# A replay: the key is finished, so its stored result comes back and nothing runs.
results.append(ship.delay(7).get(timeout=90))
jobs = [list(row) for row in Job.objects.values_list("key", "state")]
client = Client()
client.force_login(User.objects.create_superuser("admin", "admin@example.com", "x"))
page = client.get("/admin/celery_idem/job/")
print(json.dumps({
    "package": celery_idem.__file__,
    "results": results,
    "jobs": jobs,
    "admin_status": page.status_code,
    "admin_lists_the_key": "ship/7" in page.content.decode(),
    "stylesheet": bool(finders.find("celery_idem/admin.css")),
}))
""",
    "smoke_recover.py": """\
import json
import os
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "smokeproj.settings")
django.setup()

from django.core.management import call_command  # noqa: E402

from celery_idem.models import Job  # noqa: E402

# The recovery pass (idem_reap, as beat would run it) until the job of a killed worker
# has run again and finished, or the deadline passes.
key, deadline = sys.argv[1], time.monotonic() + 90
while time.monotonic() < deadline:
    call_command("idem_reap", verbosity=0)
    job = Job.objects.get(key=key)
    if job.state == "SUCCEEDED":
        break
    time.sleep(0.5)
print(json.dumps({"state": job.state, "attempt": job.attempt, "result": job.result}))
""",
}


def write(root: Path) -> None:
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
