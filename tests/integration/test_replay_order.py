"""A replay returns what the first caller got: the same JSON, keys in the same order, with
real workers on every database (PostgreSQL keeps the result as ``json``, not ``jsonb``)."""

from __future__ import annotations

import json

from django.db import connection

from celery_idem.models import Job
from django_app.effects.models import Effect
from django_app.effects.tasks import ship_order

TIMEOUT = 90


def test_a_replayed_result_has_the_first_callers_keys_in_their_order(worker):
    """ship_order returns {"shipped": n, "attempt": 1}: jsonb would give it back as
    {"attempt": 1, "shipped": n}. The duplicate's caller gets the first caller's JSON."""
    first = ship_order.delay(3801).get(timeout=TIMEOUT)
    again = ship_order.delay(3801).get(timeout=TIMEOUT)
    assert list(first) == ["shipped", "attempt"]
    assert json.dumps(again) == json.dumps(first)
    assert Effect.objects.filter(key="ship/3801").count() == 1
    job = Job.objects.get(key="ship/3801")
    with connection.cursor() as cursor:  # the stored text itself, as the server keeps it
        cursor.execute("SELECT result FROM celery_idem_job WHERE id = %s", [job.id])
        (stored,) = cursor.fetchone()
    stored = json.loads(stored) if isinstance(stored, str | bytes) else stored
    assert json.dumps(stored) == json.dumps(first)
