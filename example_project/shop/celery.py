import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

app = Celery("shop")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()  # shop.tasks and celery_idem.tasks (the recovery pass)

if os.environ.get("SHOP_DEMO_EVENTS"):
    from . import instrumentation  # noqa: F401  - the demo counts deliveries and waits
