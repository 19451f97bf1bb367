"""The chaos suite: jobs under faults on PostgreSQL, PostgreSQL behind PgBouncer or MariaDB,
with Redis or RabbitMQ.

    PYTHONPATH=. .venv/bin/python tests/chaos/run.py --broker redis --jobs 300 --duration 60

It starts its own PostgreSQL cluster (initdb, a port from 55432); with ``--database
pgbouncer`` that cluster (a port from 55532) behind a PgBouncer of its own in transaction
pooling (tests/services/pgbouncer.py, a port from 26432, below the ephemeral ports so that
nothing takes it while PgBouncer restarts), through which every process connects; with
``--database mariadb`` its own mariadbd (tests/services/mariadb.py, a port from 53306); and, for
``--broker redis``, its own Redis without persistence (a port from 63790); RabbitMQ is the shared
one on 127.0.0.1:5672 with queues named for this run (deleted at the end; RabbitMQ is
never restarted). Then four prefork workers (``--concurrency`` children each), ``celery
beat`` running the recovery pass, and the fake payment provider on 127.0.0.1. It
publishes ``--jobs`` keys over ``--duration`` seconds, each two or three times (some
copies while the first runs), of three effect kinds: an atomic row, a keyed charge, a
non-idempotent counter line; meanwhile it injects faults at seeded random moments
(``faults.py``). Then it drains (waits, with recovery passes, until every job finished),
stops everything and checks (``checks.py``); the exit status is 1 if a check failed or a
fault kind struck fewer times than required. ``--out PREFIX`` writes the report to
``PREFIX.json`` and ``PREFIX.md``; ``--release`` sizes the run for the release proof.
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
from tests.chaos.faults import Fault, Injector, fault_counts, kills, schedule  # noqa: E402
from tests.chaos.fleet import Fleet  # noqa: E402
from tests.chaos.publisher import KINDS, Publisher  # noqa: E402
from tests.chaos.report import machine, write  # noqa: E402
from tests.chaos.servers import DATABASE_NAME, Postgres, Redis, free_port  # noqa: E402
from tests.services import pgbouncer  # noqa: E402
from tests.services.mariadb import MariaDB  # noqa: E402

RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"
#: The recovery settings of the run (docs/how-to/recovery.md): short leases and timeouts, so a
#: frozen or killed attempt is taken over, and a lost message re-sent, within a small run.
LEASE = 6
IDEM_SETTINGS = {"DEFAULT_LEASE": LEASE, "DISPATCH_TIMEOUT": 10, "DISPATCH_MAX_BACKOFF": 60,
                 "NEVER_SENT_TIMEOUT": 10, "IN_PROGRESS_BACKOFF": 0.5,
                 "IN_PROGRESS_MAX_BACKOFF": 3}
#: The first ports tried per ``--database`` (its server's; its Redis's): apart, so that
#: tiers running side by side (tests/run.py's lanes) never race for one.
PORTS = {"postgres": (55432, 63790), "pgbouncer": (55532, 63990), "mariadb": (53306, 63890)}
PGBOUNCER_PORT = 26432
#: Unset options, by size: a small run, and the release proof (at least 10,000 jobs, 50
#: SIGKILLs, a zombie and a broker loss on each stack).
SMALL = {"jobs": 300, "duration": 60.0, "kills": 0, "zombies": 0, "broker_losses": 0}
RELEASE = {"jobs": 10000, "duration": 1200.0, "kills": 50, "zombies": 1, "broker_losses": 1}
LABELS = {"postgres": "PostgreSQL 15", "mariadb": "MariaDB",
          "pgbouncer": "PostgreSQL 15 behind PgBouncer (transaction pooling)"}


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    parser.add_argument("--database", choices=tuple(PORTS), default="postgres",
                        help="the job database's server (pgbouncer: PostgreSQL behind it), "
                             "started and restarted by the run")
    parser.add_argument("--durability", choices=("database", "broker"), default="database",
                        help="CELERY_IDEM_DURABILITY of the run (broker: RabbitMQ only)")
    parser.add_argument("--jobs", type=int, help="keys published (default 300)")
    parser.add_argument("--duration", type=float,
                        help="seconds over which they are published and faults strike "
                             "(default 60)")
    parser.add_argument("--kills", type=int, help="at least this many SIGKILLs, one in five "
                        "of a whole worker (default: as the duration gives)")
    parser.add_argument("--zombies", type=int, help="at least this many frozen children")
    parser.add_argument("--broker-losses", type=int,
                        help="at least this many Redis restarts (--broker redis)")
    parser.add_argument("--release", action="store_true",
                        help="the release proof's size, for options not given: "
                             + ", ".join(f"--{k.replace('_', '-')} {v:g}"
                                         for k, v in RELEASE.items()))
    parser.add_argument("--out", type=Path,
                        help="write the report to OUT.json and OUT.md (e.g. "
                             "tests/chaos/results/release-pgbouncer)")
    parser.add_argument("--seed", type=int, default=None, help="the faults' RNG (printed)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2, help="prefork children each")
    parser.add_argument("--hold", type=float, default=0.5, help="longest body, seconds")
    parser.add_argument("--drain-timeout", type=float, default=300)
    parser.add_argument("--recovery-interval", type=float, default=2,
                        help="seconds between beat's recovery passes")
    args = parser.parse_args(argv)
    for name, value in (RELEASE if args.release else SMALL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.durability == "broker" and args.broker != "rabbitmq":
        # Its Redis restarts lose queued messages on purpose: without an intent nothing
        # re-sends them (what broker durability gives up; check celery_idem.W008).
        parser.error("--durability broker needs --broker rabbitmq")
    if args.broker_losses and args.broker != "redis":
        parser.error("a broker loss (--broker-losses, --release) needs --broker redis "
                     "(RabbitMQ is shared, never restarted)")
    return args


def at_least(args: argparse.Namespace) -> dict[str, int]:
    """The fault counts the options ask for (none: as the duration gives)."""
    counts = {"zombie": args.zombies, "redis_restart": args.broker_losses}
    counts.update(kills(args.kills))
    return {kind: n for kind, n in counts.items() if n}


def database_env(kind: str, port: int, pooler: pgbouncer.PgBouncer | None) -> dict[str, str]:
    """The settings' variables (django_app/settings.py) for the run's own server; behind
    ``pooler``, every connection goes through it (the server's port is only named)."""
    if kind == "mariadb":
        return {"IDEM_DATABASE": "mysql", "IDEM_MYSQL_HOST": "127.0.0.1",
                "IDEM_MYSQL_PORT": str(port), "IDEM_MYSQL_NAME": DATABASE_NAME}
    return {"IDEM_DATABASE": "postgres", "IDEM_PG_HOST": "127.0.0.1",
            "IDEM_PG_PORT": str(port), "IDEM_PG_NAME": DATABASE_NAME,
            **(pgbouncer.environment(pooler) if pooler is not None else {})}


def configure(args: argparse.Namespace, folder: Path, database: dict[str, str], broker: str,
              queue: str) -> dict[str, str]:
    """The environment of the driver and of every process it starts; sets up Django."""
    import json

    # The settings a test tier gave this process are not the run's (its own servers').
    for name in ("IDEM_DB_NAME", "IDEM_RESULTS", "IDEM_PG_APPLICATION_NAME",
                 "IDEM_WORKER_CONNECTIONS", "IDEM_PGBOUNCER", "IDEM_PG_DIRECT_PORT"):
        os.environ.pop(name, None)
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "django_app.settings", "PYTHONPATH": str(ROOT),
        **database, "IDEM_BROKER": broker, "IDEM_QUEUE": queue,
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
    print(f"chaos: {LABELS[args.database]}, broker {args.broker} "
          f"(durability {args.durability}), "
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
        database_port, redis_port = PORTS[args.database]
        database = server(Path(tempfile.mkdtemp(prefix=f"chaos-db-{run_id}-")),
                          free_port(database_port))
        stack.callback(database.stop)  # registered first: a failed start is cleaned too
        database.start()
        database.createdb(DATABASE_NAME)
        pooler = None
        if args.database == "pgbouncer":
            # A server session per pool child, and a few for the driver: fewer than the
            # clients (each child has two connections, Django's and the bookkeeping one),
            # so they share sessions as behind any transaction pooler.
            pooler = pgbouncer.start(upstream_port=database.port,
                                     pool_size=args.workers * args.concurrency + 4,
                                     port=free_port(PGBOUNCER_PORT))
            stack.callback(pooler.stop)
        queue = f"chaos-{run_id}"
        redis = None
        if args.broker == "redis":
            redis = Redis(folder / "redis", free_port(redis_port))
            stack.callback(redis.stop)
            redis.start()
            broker = f"redis://127.0.0.1:{redis.port}/0"
        else:
            broker = RABBITMQ
            stack.callback(delete_queues, [queue, f"{queue}-recovery"])
        env = configure(args, folder, database_env(args.database, database.port, pooler),
                        broker, queue)
        from django_app.fakes.provider import serve

        provider = stack.enter_context(serve())
        fleet = Fleet(folder, env, [queue, f"{queue}-recovery"], args.workers,
                      args.concurrency)
        stack.callback(fleet.stop)
        fleet.start()
        publisher = Publisher(args.jobs, args.duration, args.hold, rng, folder, provider.url)
        required = at_least(args)
        plan = schedule(rng, args.duration, fault_counts(args.duration, redis is not None,
                                                         pooler is not None, required))
        injector = Injector(plan, rng, fleet, database, redis, folder, LEASE, queue,
                            publisher.canaries, publisher.target, pooler, required)
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
        injector.stopping.set()  # before the fleet stops under a fault in flight
        injector.join()
        fleet.stop()
        checks, figures = collect(published, provider.provider, folder, injector.faults)
        versions = machine(database, pooler, redis)
    elapsed = time.monotonic() - began
    faults = Counter(f.kind for f in injector.faults)
    title = {"command": "tests/chaos/run.py " + " ".join(argv or sys.argv[1:]),
             "seed": seed, "database": LABELS[args.database] + (
                 f", pool of {pooler.pool_size} server sessions" if pooler else ""),
             "broker": f"{args.broker}, durability {args.durability}",
             "workers": f"{args.workers} prefork x {args.concurrency} (+ replacements)",
             "jobs": f"{len(published)} ({', '.join(KINDS)})",
             "messages published": f"{counts['copies sent']} "
                                   f"({counts['publish errors']} publishes failed, sent again)",
             **redis_figures(injector.faults),
             "recovery moves in the histories": ", ".join(
                 f"{event} {n}" for event, n in figures["events"].items()) or "none",
             "provider requests / charges": f"{figures['provider requests']} / "
                                            f"{figures['charges at the provider']}",
             "SIGKILLs (pool children + whole workers)":
                 f"{faults['kill_child'] + faults['kill_worker']}",
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
    short = injector.shortfalls()
    if short:
        print("FAILED faults struck fewer times than required (struck, required): "
              f"{short}")
    ok = not failed and not injector.errors and not short
    if args.out:
        write(args.out, ok, title, checks, injector, wall_start, figures, versions)
        print(f"report written to {args.out}.json and {args.out}.md")
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
