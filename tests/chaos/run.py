"""The chaos suite: jobs under faults on PostgreSQL (or MariaDB) + Redis or RabbitMQ.

    PYTHONPATH=. .venv/bin/python tests/chaos/run.py --broker redis --jobs 300 --duration 60

It starts its own PostgreSQL cluster (initdb, a port from 55432), or with ``--database
mariadb`` its own mariadbd (tests/services/mariadb.py, a port from 53306), and, for
``--broker redis``, its own Redis without persistence (a port from 63790); RabbitMQ is the shared
one on 127.0.0.1:5672 with queues named for this run (deleted at the end; RabbitMQ is
never restarted). Then four prefork workers (``--concurrency`` children each), ``celery
beat`` running the recovery pass, and the fake payment provider on 127.0.0.1. It
publishes ``--jobs`` keys over ``--duration`` seconds, each two or three times (some
copies while the first runs), of three effect kinds: an atomic row, a keyed charge, a
non-idempotent counter line; meanwhile it injects faults at seeded random moments
(``faults.py``). Then it drains (waits, with recovery passes, until every job finished),
stops everything and checks (``checks.py``); the exit status is 1 if a check failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.chaos.checks import collect, markdown  # noqa: E402
from tests.chaos.faults import Fault, Injector, schedule  # noqa: E402
from tests.chaos.fleet import Fleet  # noqa: E402
from tests.chaos.publisher import KINDS, Publisher  # noqa: E402
from tests.chaos.servers import Postgres, Redis, free_port  # noqa: E402
from tests.services.mariadb import MariaDB  # noqa: E402

RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"
#: The recovery settings of the run (docs/how-to/recovery.md): short leases and timeouts, so a
#: frozen or killed attempt is taken over, and a lost message re-sent, within a small run.
LEASE = 6
IDEM_SETTINGS = {"DEFAULT_LEASE": LEASE, "DISPATCH_TIMEOUT": 10, "DISPATCH_MAX_BACKOFF": 60,
                 "NEVER_SENT_TIMEOUT": 10, "IN_PROGRESS_BACKOFF": 0.5,
                 "IN_PROGRESS_MAX_BACKOFF": 3}


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    parser.add_argument("--database", choices=("postgres", "mariadb"), default="postgres",
                        help="the job database's server, started and restarted by the run")
    parser.add_argument("--durability", choices=("database", "broker"), default="database",
                        help="CELERY_IDEM_DURABILITY of the run (broker: RabbitMQ only)")
    parser.add_argument("--jobs", type=int, default=300, help="keys published (default 300)")
    parser.add_argument("--duration", type=float, default=60,
                        help="seconds over which they are published and faults strike")
    parser.add_argument("--seed", type=int, default=None, help="the faults' RNG (printed)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2, help="prefork children each")
    parser.add_argument("--hold", type=float, default=0.5, help="longest body, seconds")
    parser.add_argument("--drain-timeout", type=float, default=300)
    parser.add_argument("--recovery-interval", type=float, default=2,
                        help="seconds between beat's recovery passes")
    args = parser.parse_args(argv)
    if args.durability == "broker" and args.broker != "rabbitmq":
        # Its Redis restarts lose queued messages on purpose: without an intent nothing
        # re-sends them (what broker durability gives up; check celery_idem.W008).
        parser.error("--durability broker needs --broker rabbitmq")
    return args


def database_env(kind: str, port: int) -> dict[str, str]:
    """The settings' variables (django_app/settings.py) for the run's own server."""
    if kind == "mariadb":
        return {"IDEM_DATABASE": "mysql", "IDEM_MYSQL_HOST": "127.0.0.1",
                "IDEM_MYSQL_PORT": str(port), "IDEM_MYSQL_NAME": "chaos"}
    return {"IDEM_DATABASE": "postgres", "IDEM_PG_HOST": "127.0.0.1",
            "IDEM_PG_PORT": str(port), "IDEM_PG_NAME": "chaos"}


def configure(args: argparse.Namespace, folder: Path, db_port: int, broker: str,
              queue: str) -> dict[str, str]:
    """The environment of the driver and of every process it starts; sets up Django."""
    import json

    for name in ("IDEM_DB_NAME", "IDEM_RESULTS", "IDEM_PG_APPLICATION_NAME",
                 "IDEM_WORKER_CONNECTIONS"):
        os.environ.pop(name, None)
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "django_app.settings", "PYTHONPATH": str(ROOT),
        **database_env(args.database, db_port), "IDEM_BROKER": broker, "IDEM_QUEUE": queue,
        "IDEM_VAR_DIR": str(folder / "var"), "CHAOS_RECOVERY_QUEUE": f"{queue}-recovery",
        "CHAOS_RECOVERY_INTERVAL": str(args.recovery_interval),
        **{f"CELERY_IDEM_{k}": json.dumps(v) for k, v in IDEM_SETTINGS.items()},
        "CELERY_IDEM_DURABILITY": json.dumps(args.durability),
    })
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import django_app.celery  # noqa: F401  (the app the tasks publish with)
    import django_app.effects.tasks  # noqa: F401
    return dict(os.environ)


def drain(timeout: float, keys: set[str], unwritten: bool = False) -> float:
    """Wait until no job is PENDING or RUNNING, running a recovery pass every 2 s;
    seconds taken. ``unwritten`` (broker durability): a message not claimed yet has no
    row, so also wait for a row per key."""
    from django.db import connections

    from celery_idem.models import Job
    from celery_idem.recovery import reap

    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            reap()
            done = Job.objects.filter(key__in=keys, state="SUCCEEDED").count()
            unfinished = Job.objects.filter(state__in=("PENDING", "RUNNING")).count()
        except Exception as exc:
            print(f"  drain: {type(exc).__name__}: {exc}", flush=True)
            connections.close_all()
            done, unfinished = -1, -1
        rows = Job.objects.filter(key__in=keys).count() if unwritten and done >= 0 else len(keys)
        if unfinished == 0 and done >= 0 and rows == len(keys):
            # Every job is SUCCEEDED, or FAILED / UNCERTAIN / EXPIRED, where it stays
            # without an operator: nothing more can happen (the checks say which).
            return time.monotonic() - start
        print(f"  drain {time.monotonic() - start:4.0f}s: {done}/{len(keys)} succeeded, "
              f"{unfinished} unfinished", flush=True)
        time.sleep(2)  # the interval between recovery passes, not synchronisation
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    rng = random.Random(seed)
    run_id = uuid.uuid4().hex[:8]
    print(f"chaos: {args.database}, broker {args.broker} (durability {args.durability}), "
          f"{args.jobs} jobs over "
          f"{args.duration:g}s, "
          f"{args.workers} prefork workers x {args.concurrency}, seed {seed}", flush=True)
    # A SIGTERM (a CI timeout) unwinds through the teardown like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # the provider's request log
    folder = Path(tempfile.mkdtemp(prefix=f"chaos-{run_id}-"))
    (folder / "running").mkdir()
    (folder / "var").mkdir()
    began = time.monotonic()
    wall_start = time.time()
    with ExitStack() as stack:
        server = MariaDB if args.database == "mariadb" else Postgres
        database = server(Path(tempfile.mkdtemp(prefix=f"chaos-db-{run_id}-")),
                          free_port(53306 if args.database == "mariadb" else 55432))
        stack.callback(database.stop)  # registered first: a failed start is cleaned too
        database.start()
        database.createdb("chaos")
        queue = f"chaos-{run_id}"
        redis = None
        if args.broker == "redis":
            # Ports apart per database: the MariaDB tier's run can start its Redis at the
            # same moment as a PostgreSQL tier's (tests/run.py runs them side by side).
            redis = Redis(folder / "redis",
                          free_port(63890 if args.database == "mariadb" else 63790))
            stack.callback(redis.stop)
            redis.start()
            broker = f"redis://127.0.0.1:{redis.port}/0"
        else:
            broker = RABBITMQ
            stack.callback(delete_queues, [queue, f"{queue}-recovery"])
        env = configure(args, folder, database.port, broker, queue)
        from django_app.fakes.provider import serve

        provider = stack.enter_context(serve())
        fleet = Fleet(folder, env, [queue, f"{queue}-recovery"], args.workers,
                      args.concurrency)
        stack.callback(fleet.stop)
        fleet.start()
        publisher = Publisher(args.jobs, args.duration, args.hold, rng, folder, provider.url)
        injector = Injector(schedule(rng, args.duration, redis is not None), rng, fleet,
                            database, redis, folder, LEASE, queue, publisher.canaries,
                            publisher.target)
        stack.callback(injector.stopping.set)
        setup = time.monotonic() - began
        print(f"setup {setup:.0f}s; logs in {folder}", flush=True)
        injector.start()
        publisher.run(lambda t: print(
            f"  {t:5.0f}s published {len(publisher.published)} keys, "
            f"{publisher.counts['copies sent']} copies; faults so far {len(injector.faults)}",
            flush=True))
        injector.join(timeout=args.drain_timeout)
        published, counts, log = publisher.published, publisher.counts, publisher.log
        drained = drain(args.drain_timeout, set(published), args.durability == "broker")
        fleet.stop()
        checks, figures = collect(published, provider.provider, folder, injector.faults)
    elapsed = time.monotonic() - began
    faults = Counter(f.kind for f in injector.faults)
    title = {"command": "tests/chaos/run.py " + " ".join(argv or sys.argv[1:]),
             "seed": seed, "broker": f"{args.broker}, " + (
                 "MariaDB" if args.database == "mariadb" else "PostgreSQL 15")
                 + f", durability {args.durability}",
             "workers": f"{args.workers} prefork x {args.concurrency} (+ replacements)",
             "jobs": f"{len(published)} ({', '.join(KINDS)})",
             "messages published": f"{counts['copies sent']} "
                                   f"({counts['publish errors']} publishes failed, sent again)",
             **redis_figures(injector.faults),
             "recovery moves in the histories": ", ".join(
                 f"{event} {n}" for event, n in figures["events"].items()) or "none",
             "provider requests / charges": f"{figures['provider requests']} / "
                                            f"{figures['charges at the provider']}",
             "elapsed": f"{elapsed:.0f}s (setup {setup:.0f}s, drain {drained:.0f}s)"}
    print("\n" + markdown(title, checks, faults))
    failed = [c for c in checks if not c.ok]
    for check in failed:
        print(f"\nFAILED {check.name}: {check.value}; e.g. " + "; ".join(check.examples[:5]))
    for problem in injector.errors:
        print(f"FAILED a fault could not be injected: {problem}")
    if injector.skipped:
        print("skipped (no busy child at that moment; tried again after the plan, on a "
              f"job of its own): {dict(Counter(injector.skipped))}")
    for fault in injector.faults:
        print(f"fault at +{fault.at - wall_start:.1f}s: {fault.kind} {fault.detail}")
    for line in log[:5]:
        print(f"publish retried: {line}")
    missing = {"kill_child", "kill_worker", "zombie", "pg_restart"} - set(faults)
    if redis is not None and "redis_restart" not in faults:
        missing.add("redis_restart")
    if missing:
        print(f"FAILED faults never injected: {sorted(missing)}")
    ok = not failed and not injector.errors and not missing
    if ok:
        shutil.rmtree(folder, ignore_errors=True)
    print("\nchaos: " + ("every check passed" if ok else f"FAILED (logs in {folder})"))
    return 0 if ok else 1


def redis_figures(faults: list[Fault]) -> dict[str, str]:
    restarts = [f.detail for f in faults if f.kind == "redis_restart"]
    if not restarts:
        return {}
    whole = sum(len(d["keys_with_every_message_lost"]) for d in restarts)
    return {"Redis restarts: messages dropped":
            f"{sum(d['queued_lost'] for d in restarts)} queued, "
            f"{sum(d['unacked_lost'] for d in restarts)} unacked; {whole} keys lost every "
            "message (published just before the crash), so only recovery's re-send from the "
            "stored envelope could run them"}


def delete_queues(names: list[str]) -> None:
    """Delete this run's own queues on the shared RabbitMQ (never anyone else's)."""
    from kombu import Connection

    with Connection(RABBITMQ) as conn:
        channel = conn.channel()
        for name in names:
            channel.queue_delete(name)


if __name__ == "__main__":
    sys.exit(main())
