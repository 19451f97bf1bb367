"""bench/scaling.py's admin measurement at one table size: the job changelist rendered
through Django's test client as a superuser, unfiltered, filtered, searched and far
down, with its query count and slowest queries.
"""

from __future__ import annotations

import statistics
import time
from typing import Any


def admin_changelist() -> dict[str, Any]:
    try:
        from django.contrib.auth import get_user_model
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext, setup_test_environment
    except ImportError as exc:
        return {"pending": str(exc)}
    try:
        from django.contrib import admin

        from celery_idem.models import Job

        if Job not in admin.site._registry:
            return {"pending": "celery_idem's Job is not registered in the admin"}
    except Exception as exc:  # noqa: BLE001
        return {"pending": f"admin not importable: {exc}"}
    try:
        setup_test_environment()
    except RuntimeError:
        pass  # already set up
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    out: dict[str, Any] = {}
    for label, url in (("unfiltered", "/admin/celery_idem/job/"),
                       ("state=RUNNING", "/admin/celery_idem/job/?state__exact=RUNNING"),
                       ("search key prefix", "/admin/celery_idem/job/?q=bench%2F"),
                       ("page 100", "/admin/celery_idem/job/?p=100")):
        timings = []
        queries = 0
        status = None
        for _ in range(3):
            with CaptureQueriesContext(connection) as q:
                started = time.perf_counter()
                response = client.get(url)
                timings.append(1e3 * (time.perf_counter() - started))
            status = response.status_code
            queries = len(q.captured_queries)
            slowest = sorted(q.captured_queries, key=lambda x: -float(x["time"]))[:3]
        out[label] = {"status": status, "ms": round(statistics.median(timings), 1),
                      "queries": queries,
                      "slowest_queries": [{"ms": round(1e3 * float(x["time"]), 2),
                                           "sql": x["sql"][:240]} for x in slowest]}
    return out
