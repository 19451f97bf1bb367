"""The variants of the end-to-end suite: what each one publishes, and the tables a run
starts from. The variants themselves are listed in end_to_end.py's docstring."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any
from unittest import mock

from bench.lib import common as c

VARIANTS = ("raw", "django", "once", "floor", "floor-django", "floor-intent", "idem",
            "idem-broker", "atomic", "atomic-broker", "optimistic", "replay", "replay-sent", "pub-plain", "pub-idem",
            "pub-async", "pub-broker", "pub-floor", "floor-bare", "floor-bare-broker",
            "floor-wide", "floor-split", "floor-split-hot", "django-real", "idem-real")
#: The plain variant each one's ratio and overheads are against (default ``django``).
BASELINE = {"django-real": "django-real", "idem-real": "django-real"}
#: The variants with CELERY_IDEM_DURABILITY = "broker" (producer and worker).
BROKER_DURABILITY = ("idem-broker", "atomic-broker", "optimistic", "pub-broker")
#: The variants that write the floor's intent before each publish.
FLOOR_INTENT = ("floor-intent", "pub-floor")
RAW_APP = {"raw": "bench.raw", "floor": "bench.floor"}
#: The layout floors (``floor-split`` and ``floor-split-hot`` PostgreSQL's only, as
#: bench/lib/stacks.py says): the library's statements on a candidate layout of
#: the job row (bench/lib/layouts_sql.py), the intent written at publish as the library's is,
#: except in ``floor-bare-broker`` (durability "broker": the claim inserts the row).
LAYOUT_FLOORS = {"floor-bare": "bare", "floor-bare-broker": "bare", "floor-wide": "current",
                 "floor-split": "split", "floor-split-hot": "split_hot"}


def sender(variant: str) -> Any:
    """A function publishing one message of ``variant`` with a given producer and queue."""
    from bench.lib import tasks as t
    from bench.lib.worker_app import app

    if variant in LAYOUT_FLOORS:
        return layout_sender(LAYOUT_FLOORS[variant], intent=variant != "floor-bare-broker")
    if variant in RAW_APP:
        name = RAW_APP[variant]
        return lambda key, queue, producer: app.send_task(
            name, (key,), queue=queue, producer=producer)
    task = {"django": t.bench_plain, "pub-plain": t.bench_plain, "once": t.bench_once,
            "idem": t.bench_idem, "replay": t.bench_idem, "replay-sent": t.bench_idem, "pub-idem": t.bench_idem,
            "pub-async": t.bench_idem, "idem-broker": t.bench_idem, "pub-broker": t.bench_idem,
            "atomic": t.bench_atomic, "atomic-broker": t.bench_atomic,
            "optimistic": t.bench_optimistic,
            "floor-django": t.bench_floor_django, "floor-intent": t.bench_floor_django,
            "pub-floor": t.bench_plain, "django-real": t.bench_plain_real,
            "idem-real": t.bench_idem_real}[variant]
    if task is None:
        raise SystemExit("variant 'once' needs celery-once (pip install celery-once)")
    if variant in FLOOR_INTENT:
        def send(key: str, queue: str, producer: Any) -> Any:
            floor_intent(key)  # committed before the message leaves
            return task.apply_async((key,), queue=queue, producer=producer)
        return send
    return lambda key, queue, producer: task.apply_async((key,), queue=queue, producer=producer)


def floor_intent(key: str) -> None:
    """The floor's intent of ``key``, autocommitted on this process's Django connection."""
    from django.db import connection

    from bench.lib.floor_sql import INTENT

    with connection.cursor() as cursor:
        cursor.execute(INTENT[connection.vendor], (key,))


def layout_sender(layout: str, intent: bool) -> Any:
    """Publishing for a layout floor: the layout's intent (unless not ``intent``), with
    the values the library's row of the same task holds (a lean stored message, the
    arguments, the queue), autocommitted on this process's Django connection, then the
    message."""
    from django.db import connection

    from bench.lib import layouts_sql
    from bench.lib import tasks as t

    statement = layouts_sql.layouts(connection.vendor)[layout].intent

    def send(key: str, queue: str, producer: Any) -> Any:
        task_id = str(uuid.uuid4())
        if not intent:
            return t.bench_floor_layout.apply_async((key, layout, True), queue=queue,
                                                    producer=producer, task_id=task_id)
        with connection.cursor() as cursor:
            cursor.execute(statement, {
                **layouts_sql.library_values(t.LAYOUT_NAMESPACE, key, queue),
                "task_id": task_id})
        return t.bench_floor_layout.apply_async((key, layout), queue=queue,
                                                producer=producer, task_id=task_id)
    return send


#: The variants that publish keys already SUCCEEDED.
REPLAYS = ("replay", "replay-sent")


def replays_sent() -> Any:
    """``replay-sent``: every replay's message leaves, as one whose result is stored or
    that carries a callback does (celery_idem.replays), so its worker reads the row and
    returns the stored outcome: what a replay cost before publishes were answered."""
    from celery_idem import replays

    return mock.patch.object(replays, "seen", lambda task, body, headers: True)


@contextmanager
def unflushed_intents() -> Iterator[None]:
    """Prototype, this benchmark only: the intent's commit does not wait for the WAL flush
    (written as a claim is, ``flush`` ignored). The library flushes it on purpose: an
    intent lost in a PostgreSQL crash would leave its message to be refused as
    IntentMissing."""
    from celery_idem.backends.postgresql import PostgreSQLBackend

    original = PostgreSQLBackend._write
    PostgreSQLBackend._write = (  # type: ignore[method-assign]
        lambda self, sql, params, flush=False: original(self, sql, params))
    try:
        yield
    finally:
        PostgreSQLBackend._write = original  # type: ignore[method-assign]


class CountingProducer:
    """A kombu producer that counts the messages it sends: a publish the library answers
    without a message (a finished key nobody would see replayed) sends none."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer
        self.sent = 0

    def publish(self, *args: Any, **kwargs: Any) -> Any:
        self.sent += 1
        return self._producer.publish(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


def publish(variant: str, keys: list[str], queue: str) -> tuple[float, float, int]:
    """Publish one message per key; (wall seconds, this process's CPU seconds, messages
    that left)."""
    from django.test import override_settings

    from bench.lib.worker_app import app

    send = sender(variant)
    durability = override_settings(CELERY_IDEM_DURABILITY="broker") \
        if variant in BROKER_DURABILITY else nullcontext()
    prototype = {"pub-async": unflushed_intents, "replay-sent": replays_sent}.get(variant)
    with app.producer_or_acquire() as pooled, durability, (
            prototype() if prototype else nullcontext()):
        producer = CountingProducer(pooled)
        cpu0, wall0 = sum(os.times()[:2]), time.perf_counter()
        for key in keys:
            send(key, queue, producer)
        return time.perf_counter() - wall0, sum(os.times()[:2]) - cpu0, producer.sent


def finished_keys(keys: list[str]) -> None:
    """Make ``keys`` SUCCEEDED jobs as a first run would (for ``replay``; not timed)."""
    from django.db import connection

    scratch = c.new_queue("bench-scratch")
    try:
        publish("idem", keys, scratch)  # the intents, on a queue no worker reads
    finally:
        c.delete_queue(os.environ["BENCH_BROKER"], scratch)
    with connection.cursor() as cursor:
        cursor.execute(FINISH_PENDING[connection.vendor])


#: finished_keys' statement, per vendor (the result is the key, as the task returns it).
FINISH_PENDING = {
    "postgresql": "UPDATE celery_idem_job SET state = 'SUCCEEDED', attempt = 1,"
                  " result = to_jsonb(key), started_at = now(), finished_at = now()"
                  " WHERE state = 'PENDING'",
    "mysql": "UPDATE celery_idem_job SET state = 'SUCCEEDED', attempt = 1,"
             " result = JSON_QUOTE(`key`), started_at = UTC_TIMESTAMP(6),"
             " finished_at = UTC_TIMESTAMP(6) WHERE state = 'PENDING'",
}


def reset(variant: str) -> None:
    """Empty the tables a run writes: the library's, the effects, the floors' own, and
    make a layout floor's tables anew."""
    from django.db import connection

    from bench.lib import layouts_sql
    from bench.lib.floor_sql import TABLE

    c.reset_tables()
    with connection.cursor() as cursor:  # the floors' table (floor, floor-django, -intent)
        cursor.execute(TABLE[connection.vendor])
        cursor.execute("TRUNCATE TABLE bench_floor_job")
        if variant in LAYOUT_FLOORS:
            layouts_sql.create(cursor, LAYOUT_FLOORS[variant], connection.vendor)


def effects(prefix: str) -> int:
    from django_app.effects.models import Effect

    return Effect.objects.filter(key__startswith=prefix).count()
