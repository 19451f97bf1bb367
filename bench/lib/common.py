"""Shared helpers for the benchmarks: environment, database, broker, worker, results.

Every benchmark runs isolated from the test suite and from other engineers' runs:

- its own PostgreSQL database (``IDEM_PG_NAME``, default ``idem_bench``), created and
  migrated here, dropped by ``--drop``;
- Redis DB 6 as the broker and DB 7 for celery-once's locks (keys it made are deleted,
  never FLUSHDB/FLUSHALL);
- a fresh queue name per run, deleted afterwards;
- ``IDEM_VAR_DIR`` (default ``/tmp/idem-bench``) for worker logs.

Every wait is bounded by a deadline.

Also here: Django's connections in a benchmark process, all closed (the library's
bookkeeping ones too) or pointed at the PostgreSQL server itself for a block when the run
goes through PgBouncer. The worker subprocess is bench/lib/workers.py and what a results
file records of the run (versions, machine) bench/lib/environment.py.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REDIS_HOST = "127.0.0.1"
REDIS_PORT = 6379
BROKER_DB = 6
LOCK_DB = 7
BROKERS = {
    "redis": f"redis://{REDIS_HOST}:{REDIS_PORT}/{BROKER_DB}",
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672//",
}
PG_ADMIN = {"host": os.environ.get("IDEM_PG_HOST", "127.0.0.1"),
            "port": int(os.environ.get("IDEM_PG_PORT", "5432")),
            "user": os.environ.get("IDEM_PG_USER", "postgres")}
MYSQL_ADMIN = {"host": os.environ.get("IDEM_MYSQL_HOST", "127.0.0.1"),
               "port": int(os.environ.get("IDEM_MYSQL_PORT", "3306")),
               "user": os.environ.get("IDEM_MYSQL_USER", "root"),
               "password": os.environ.get("IDEM_MYSQL_PASSWORD", "")}


def log(*parts: Any) -> None:
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


# -- environment ---------------------------------------------------------------------------

def configure(broker: str = "redis", queue: str | None = None) -> dict[str, str]:
    """Point the Django project at the benchmark database (PostgreSQL; another stack is
    ``stacks.opened``'s, entered after this) and broker (before django.setup)."""
    os.environ.setdefault("IDEM_VAR_DIR", "/tmp/idem-bench")
    os.environ.setdefault("IDEM_PG_NAME", "idem_bench")
    os.environ["IDEM_DATABASE"] = "postgres"
    os.environ.pop("IDEM_DB_NAME", None)
    os.environ["IDEM_BROKER"] = BROKERS[broker]
    os.environ["IDEM_RESULTS"] = f"redis://{REDIS_HOST}:{REDIS_PORT}/{LOCK_DB}"
    os.environ["IDEM_QUEUE"] = queue or new_queue("bench")
    os.environ["DJANGO_SETTINGS_MODULE"] = "django_app.settings"
    os.environ.setdefault("BENCH_ONCE_URL", f"redis://{REDIS_HOST}:{REDIS_PORT}/{LOCK_DB}")
    Path(os.environ["IDEM_VAR_DIR"]).mkdir(parents=True, exist_ok=True)
    return dict(os.environ)


def new_queue(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def configure_in_process(queue: str) -> dict[str, str]:
    """``configure`` for a benchmark that runs its tasks in this process: kombu's in-memory
    transport and result backend, so PostgreSQL is the only server it measures."""
    configure("redis", queue)
    os.environ["IDEM_BROKER"] = "memory://"
    os.environ["IDEM_RESULTS"] = "cache+memory://"
    return dict(os.environ)


def setup_django(create_db: bool = True) -> None:
    """django.setup(), after creating and migrating the benchmark database if needed."""
    kind = os.environ.get("IDEM_DATABASE")
    if create_db:
        if kind == "mysql":
            ensure_mysql_database(os.environ["IDEM_MYSQL_NAME"])
        elif kind != "sqlite":  # SQLite's file is made by the migrations
            ensure_database(os.environ["IDEM_PG_NAME"])
    import django

    django.setup()
    if create_db:
        from django.core.management import call_command

        from bench.lib.common import direct_connections

        with direct_connections():  # behind PgBouncer, on the server itself
            call_command("migrate", verbosity=0, interactive=False)


def _admin_conn():
    import psycopg

    return psycopg.connect(dbname="postgres", autocommit=True, **PG_ADMIN)


def ensure_database(name: str) -> None:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"unsafe database name {name!r}")
    with _admin_conn() as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def ensure_mysql_database(name: str) -> None:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"unsafe database name {name!r}")
    import MySQLdb

    conn = MySQLdb.connect(**MYSQL_ADMIN)
    try:
        conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()


def drop_database(name: str) -> None:
    if not name.startswith("idem_bench"):
        raise ValueError(f"refusing to drop {name!r}: not a benchmark database")
    from django.db import connections

    connections.close_all()
    with _admin_conn() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def reset_tables() -> None:
    """Empty the job, history and effect tables (between variants of a round)."""
    from django.db import connection

    from celery_idem.models import Checkpoint, Job, Transition
    from django_app.effects.models import Effect

    tables = [m._meta.db_table for m in (Effect, Checkpoint, Transition, Job)]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY")
            return
        if connection.vendor == "sqlite":  # ids from 1 again, as the others restart them
            for table in tables:
                cursor.execute(f"DELETE FROM {table}")
            cursor.execute("DELETE FROM sqlite_sequence WHERE name IN ("
                           + ", ".join(["%s"] * len(tables)) + ")", tables)
            return
        # MySQL/MariaDB: one table per TRUNCATE, refused on a table a foreign key
        # references unless the checks are off (this benchmark's own session only).
        cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
        try:
            for table in tables:
                cursor.execute(f"TRUNCATE TABLE {table}")
        finally:
            cursor.execute("SET FOREIGN_KEY_CHECKS = 1")


def sessions_opened() -> int:
    """Connections ever opened to the benchmark database (pg_stat_database.sessions)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


# -- broker --------------------------------------------------------------------------------

def delete_queue(broker: str, queue: str) -> None:
    """Remove the run's queue (and, on Redis, nothing else: only keys named after it)."""
    try:
        if broker == "redis":
            import redis

            client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=BROKER_DB)
            # The queue, its priority lists, and kombu's bindings of the exchange named
            # after it (Celery declares the default queue's exchange with its name).
            client.delete(queue, *(f"{queue}\x06\x16{p}" for p in range(10)),
                          f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        else:
            from kombu import Connection

            with Connection(BROKERS[broker], connect_timeout=5) as conn:
                conn.default_channel.queue_delete(queue)
    except Exception as exc:  # noqa: BLE001 - cleanup must not hide the result
        log(f"could not delete queue {queue}: {exc}")


def clear_once_locks() -> int:
    import redis

    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=LOCK_DB)
    keys = list(client.scan_iter(match="qo_bench.once*", count=1000))
    for i in range(0, len(keys), 1000):
        client.delete(*keys[i:i + 1000])
    return len(keys)


# -- the finish marks the benchmark workers write (bench.lib.worker_app._mark) -----------------

MARK_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/{LOCK_DB}"


def marks(queue: str) -> dict[str, float]:
    """Tasks finished on ``queue`` so far, and the first and last finish (epoch s)."""
    import redis

    client = redis.Redis.from_url(MARK_URL)
    n, first, last = client.mget(f"benchmark:{queue}:n", f"benchmark:{queue}:first",
                                 f"benchmark:{queue}:last")
    return {"n": int(n or 0), "first": float(first or 0), "last": float(last or 0)}


def clear_marks(queue: str) -> None:
    import redis

    redis.Redis.from_url(MARK_URL).delete(*(f"benchmark:{queue}:{k}"
                                            for k in ("n", "first", "last")))


# -- waiting -------------------------------------------------------------------------------

def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.25,
             alive: Callable[[], bool] | None = None, on_fail: Callable[[], str] | None = None
             ) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if alive is not None and not alive():
            raise RuntimeError(f"worker exited while waiting for {what}\n"
                               + (on_fail() if on_fail else ""))
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}\n"
                               + (on_fail() if on_fail else "")[-3000:])
        time.sleep(interval)


# -- reporting -----------------------------------------------------------------------------

def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def write_result(name: str, data: dict[str, Any], out: str | None = None) -> Path:
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    log(f"wrote {path}")
    return path


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def command_line() -> str:
    return " ".join([".venv/bin/python", os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])


def close_django_connections() -> None:
    try:
        from django.db import connections

        from celery_idem import connection

        connections.close_all()
        connection.close_bookkeeping_connections()
    except Exception:  # noqa: BLE001 - Django never set up: nothing open
        pass


@contextmanager
def direct_connections() -> Iterator[None]:
    """Django's connections to the server itself for the block (behind PgBouncer: the
    migrations, as tests/conftest.py runs them), through the pooler again after."""
    pooler = os.environ.get("IDEM_PGBOUNCER") == "1" and os.environ.get("IDEM_PG_PORT")
    if not pooler:
        yield
        return
    from django.db import connections

    def point_at(port: str) -> None:
        close_django_connections()
        for conn in connections.all():
            conn.settings_dict["PORT"] = port

    point_at(os.environ.get("IDEM_PG_DIRECT_PORT", "5432"))
    try:
        yield
    finally:
        point_at(pooler)
