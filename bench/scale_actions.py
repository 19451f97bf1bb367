"""The operator actions bench/scale.py times on its table (scale_table.py), each through
the library's own entry points: the recovery pass, ``idem_status``, every admin page and
``idem_purge`` beside a concurrent inserter. Apart from the table's build, so what an
action does reads apart from how the table was made.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from datetime import timedelta
from io import StringIO
from typing import Any
from urllib.parse import urlencode

from bench import _common as c
from bench.scale_table import TASKS, UNKNOWN_TASK


def timed(action: Any, repeat: int) -> dict[str, Any]:
    """Median, min and max milliseconds of ``repeat`` runs of ``action``."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(1e3 * (time.perf_counter() - started))
    return {"median_ms": round(statistics.median(times), 1), "min_ms": round(min(times), 1),
            "max_ms": round(max(times), 1)}


def recovery(repeat: int) -> dict[str, Any]:
    from django.db import connection
    from django.utils import timezone

    from celery_idem.recovery import reap

    out: dict[str, Any] = {}
    with connection.cursor() as cursor:  # stale again, on a table reused (--reuse)
        cursor.execute("UPDATE celery_idem_job SET lease_expires_at = now() - interval '1 hour'"
                       " WHERE task_name = %s", [UNKNOWN_TASK])
    started = time.perf_counter()
    first = reap(now=timezone.now() - timedelta(seconds=first_pass_lag()))
    out["first_pass"] = {"ms": round(1e3 * (time.perf_counter() - started), 1),
                         "did": {a: first.total(a) for a in first.as_dict()}}
    reports: list[Any] = []
    out["unknown_task_claims_pass"] = timed(lambda: reports.append(reap()), repeat)
    out["unknown_task_claims_pass"]["did"] = {a: reports[-1].total(a)
                                              for a in reports[-1].as_dict()}
    with connection.cursor() as cursor:  # the unknown task's claims: a live lease now
        cursor.execute("UPDATE celery_idem_job SET lease_expires_at = now() + interval '1 day'"
                       " WHERE task_name = %s", [UNKNOWN_TASK])
    reports.clear()
    out["nothing_to_do_pass"] = timed(lambda: reports.append(reap()), repeat)
    out["nothing_to_do_pass"]["did"] = reports[-1].as_dict()
    return out


def first_pass_lag() -> float:
    """Seconds before now the first pass runs at (its clock moved back, ``reap(now=...)``):
    then the jobs it sends again are, when the rest is timed, as an operator finds them a
    while after an outage: past the dispatch timeout since that re-send, not yet due for
    the next one (whose wait doubled). A pass and idem_status must not read them one by
    one. (Moving the clock rather than their rows leaves no more row versions behind than
    a real pass does.)"""
    from celery_idem.recovery.due import redispatch_wait

    return (redispatch_wait(0) + redispatch_wait(1)) / 2


def status(repeat: int) -> dict[str, Any]:
    from django.core.management import call_command

    def run(*args: str) -> None:
        call_command("idem_status", *args, stdout=StringIO())

    return {"default": timed(run, repeat), "exact": timed(lambda: run("--exact"), repeat)}


def admin_pages(repeat: int, jobs: int) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from celery_idem.models import Job

    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    base = "/admin/celery_idem/job/"
    some = Job.objects.filter(state="FAILED").order_by("id").values("id", "key").first()
    far = max(1, min(100, jobs // 50 - 1))  # page 100, or the last but one of a small table
    pages = {"list": "", "page far down": f"?p={far}",
             "key search exact": f"?q={some['key']}", "key prefix search order/": "?q=order/",
             "task id search": "?q=" + str(Job.objects.values_list("task_id", flat=True)
                                           .filter(id=some["id"]).get()),
             "task name filter": f"?task_name={TASKS[3]}",
             "claim=stale": "?claim=stale", "claim=live": "?claim=live",
             "dead-lettered=yes": "?dead_lettered=yes", "dead-lettered=no": "?dead_lettered=no",
             "detail": f"{some['id']}/change/", "history": f"{some['id']}/history/"}
    pages |= {f"state={s}": f"?state__exact={s}" for s in
              ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "UNCERTAIN", "EXPIRED")}
    pages |= {"state=FAILED and task name": f"?state__exact=FAILED&task_name={TASKS[3]}",
              "dead-lettered=yes and task name": f"?dead_lettered=yes&task_name={TASKS[3]}"}
    # The date filter's choices, as its links write them; the sortable columns.
    today = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    for label, since, until in [
            ("today", today, today + timedelta(days=1)),
            ("past 7 days", today - timedelta(days=7), today + timedelta(days=1)),
            ("this month", today.replace(day=1), None),
            ("this year", today.replace(month=1, day=1), None)]:
        query = {"created_at__gte": str(since), **({"created_at__lt": str(until)} if until else {})}
        pages[f"created {label}"] = "?" + urlencode(query)
    pages |= {"sorted by key": "?o=1", "sorted by key, descending": "?o=-1",
              "sorted by task name": "?o=2", "sorted oldest first": "?o=6"}
    out: dict[str, Any] = {}
    for label, tail in pages.items():
        url = base + tail
        response = client.get(url)  # warm: the first render compiles templates
        assert response.status_code == 200, (url, response.status_code)
        connection.queries_log.clear()  # full (maxlen 9,000), it would capture nothing
        with CaptureQueriesContext(connection) as queries:
            client.get(url)
        out[label] = {"url": url, **timed(lambda u=url: client.get(u), repeat),
                      "queries": len(queries.captured_queries)}
        c.log(f"admin {label}: {out[label]['median_ms']} ms")
    return out


def purge(days: float) -> dict[str, Any]:
    """idem_purge of the jobs finished more than ``days`` ago, while a thread inserts a
    job every 10 ms on its own connection and records each insert's latency."""
    import psycopg
    from django.core.management import call_command
    from django.db import connection

    settings = connection.settings_dict
    stop = threading.Event()
    latencies: list[float] = []

    def insert() -> None:
        with psycopg.connect(dbname=settings["NAME"], user=settings["USER"],
                             host=settings["HOST"], port=settings["PORT"],
                             autocommit=True) as conn:
            n = 0
            while not stop.is_set():
                n += 1
                started = time.perf_counter()
                conn.execute(
                    "INSERT INTO celery_idem_job (namespace, key, task_name, fingerprint,"
                    " options, state, attempt, worker, task_id, dispatch_count, created_at,"
                    " updated_at) VALUES ('bench', 'purge-probe/' || %s, 'probe', 'fp',"
                    " '{}', 'PENDING', 0, '', '', 0, now(), now())", [f"{os.getpid()}-{n}"])
                latencies.append(1e3 * (time.perf_counter() - started))
                stop.wait(0.01)

    thread = threading.Thread(target=insert, daemon=True)
    thread.start()
    out = StringIO()
    started = time.perf_counter()
    call_command("idem_purge", "--older-than", str(days), stdout=out)
    seconds = time.perf_counter() - started
    stop.set()
    thread.join(timeout=30)
    deleted = int(out.getvalue().split()[1])
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM celery_idem_job WHERE key LIKE 'purge-probe/%%'")
    return {"older_than_days": days, "deleted_jobs": deleted, "seconds": round(seconds, 1),
            "jobs_per_s": round(deleted / seconds) if seconds else None,
            "inserts": len(latencies),
            "insert_median_ms": round(statistics.median(latencies), 2) if latencies else None,
            "insert_worst_ms": round(max(latencies), 1) if latencies else None}
