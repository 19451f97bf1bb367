"""The Celery app, configured from Django settings under the CELERY_ prefix."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_app.settings")

app = Celery("django_app")
app.config_from_object("django.conf:settings", namespace="CELERY")
if os.environ.get("IDEM_WITHOUT_LIBRARY_TASKS") == "1":
    # A worker set up without celery_idem.tasks (tests/integration/test_replace_check.py).
    from django.conf import settings

    app.autodiscover_tasks(lambda: [a for a in settings.INSTALLED_APPS if a != "celery_idem"])
else:
    app.autodiscover_tasks()
