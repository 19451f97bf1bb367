"""The chaos suite: jobs under faults on PostgreSQL + Redis or PostgreSQL + RabbitMQ.

    PYTHONPATH=. .venv/bin/python tests/chaos/run.py --broker redis --jobs 300 --duration 60

It starts its own PostgreSQL cluster (initdb, a port from 55432) and, for ``--broker
redis``, its own Redis without persistence (a port from 63790); RabbitMQ is the shared
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
import heapq
import logging
import math
import os
import random
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
from tests.chaos.faults import Injector, schedule  # noqa: E402
from tests.chaos.fleet import Fleet  # noqa: E402
from tests.chaos.servers import Postgres, Redis, free_port  # noqa: E402

RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"
KINDS = ("atomic", "charge", "count")
BURST = 3.0
#: The recovery settings of the run (docs/operations.md): short leases and timeouts, so a
#: frozen or killed attempt is taken over, and a lost message re-sent, within a small run.
LEASE = 6
IDEM_SETTINGS = {"DEFAULT_LEASE": LEASE, "DISPATCH_TIMEOUT": 10, "DISPATCH_MAX_BACKOFF": 60,
                 "NEVER_SENT_TIMEOUT": 10, "IN_PROGRESS_BACKOFF": 0.5,
                 "IN_PROGRESS_MAX_BACKOFF": 3}


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
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
    return parser.parse_args(argv)


def configure(args: argparse.Namespace, folder: Path, pg_port: int, broker: str,
              queue: str) -> dict[str, str]:
    """The environment of the driver and of every process it starts; sets up Django."""
    import json

    for name in ("IDEM_DB_NAME", "IDEM_RESULTS", "IDEM_PG_APPLICATION_NAME",
                 "IDEM_WORKER_CONNECTIONS"):
        os.environ.pop(name, None)
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "django_app.settings", "PYTHONPATH": str(ROOT),
        "IDEM_DATABASE": "postgres", "IDEM_PG_HOST": "127.0.0.1", "IDEM_PG_PORT": str(pg_port),
        "IDEM_PG_NAME": "chaos", "IDEM_BROKER": broker, "IDEM_QUEUE": queue,
        "IDEM_VAR_DIR": str(folder / "var"), "CHAOS_RECOVERY_QUEUE": f"{queue}-recovery",
        "CHAOS_RECOVERY_INTERVAL": str(args.recovery_interval),
        **{f"CELERY_IDEM_{k}": json.dumps(v) for k, v in IDEM_SETTINGS.items()},
    })
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import django_app.celery  # noqa: F401  (the app the tasks publish with)
    import django_app.effects.tasks  # noqa: F401
    return dict(os.environ)


def publish(args: argparse.Namespace, rng: random.Random, folder: Path, provider_url: str,
            injector: Injector, log: list[str]) -> tuple[dict[str, str], Counter[str]]:
    """Publish every key two or three times, paced over the duration; (key -> kind,
    counts of copies sent and publishes that failed and were tried again)."""
    from django.db import connections

    from django_app.effects.chaos_tasks import chaos_atomic, chaos_charge, chaos_count

    tasks = {"atomic": chaos_atomic, "charge": chaos_charge, "count": chaos_count}
    start = time.monotonic()
    due: list[tuple[float, int, int]] = []  # (when, job number, copy)
    holds = [round(rng.uniform(0.02, args.hold), 3) for _ in range(args.jobs)]
    # Orders come in bursts every BURST seconds, so the queue holds a backlog for a moment
    # (a Redis restart then has queued messages to lose).
    per_burst = max(1, math.ceil(args.jobs * BURST / args.duration))
    for n in range(args.jobs):
        first = (n // per_burst) * BURST + rng.uniform(0, 0.2)
        copies = [first, first + rng.uniform(0, 2 * holds[n])]  # some meet the running one
        if rng.random() < 0.3:
            copies.append(first + rng.uniform(0, 10))
        for copy, when in enumerate(copies):
            heapq.heappush(due, (when, n, copy))
    published: dict[str, str] = {}
    counts: Counter[str] = Counter()
    last_status = start
    while due:
        when, n, copy = heapq.heappop(due)
        wait = start + when - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # pacing the load, not synchronisation
        kind = KINDS[n % 3]
        call = (n, str(folder), holds[n]) + ((provider_url,) if kind == "charge" else ())
        try:
            tasks[kind].apply_async(args=call)
        except Exception as exc:  # PostgreSQL or the broker restarting: send it again soon
            counts["publish errors"] += 1
            log.append(f"publish {kind} {n}: {type(exc).__name__}: {exc}"[:300])
            connections.close_all()
            heapq.heappush(due, (time.monotonic() - start + 0.5, n, copy))
            continue
        published[f"chaos/{kind}/{n}"] = kind
        counts["copies sent"] += 1
        if time.monotonic() - last_status > 10:
            last_status = time.monotonic()
            print(f"  {time.monotonic() - start:5.0f}s published {len(published)} keys, "
                  f"{counts['copies sent']} copies; faults so far {len(injector.faults)}",
                  flush=True)
    return published, counts


def drain(timeout: float, keys: set[str]) -> float:
    """Wait until every key is finished, running a recovery pass every 2 s; seconds taken."""
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
        if done == len(keys) and unfinished == 0:
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
    print(f"chaos: broker {args.broker}, {args.jobs} jobs over {args.duration:g}s, "
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
        postgres = Postgres(Path(tempfile.mkdtemp(prefix=f"chaos-pg-{run_id}-")),
                            free_port(55432)).start()
        stack.callback(postgres.stop)
        postgres.createdb("chaos")
        queue = f"chaos-{run_id}"
        redis = None
        if args.broker == "redis":
            redis = Redis(folder / "redis", free_port(63790)).start()
            stack.callback(redis.stop)
            broker = f"redis://127.0.0.1:{redis.port}/0"
        else:
            broker = RABBITMQ
            stack.callback(delete_queues, [queue, f"{queue}-recovery"])
        env = configure(args, folder, postgres.port, broker, queue)
        from django_app.fakes.provider import serve

        provider = stack.enter_context(serve())
        fleet = Fleet(folder, env, [queue, f"{queue}-recovery"], args.workers,
                      args.concurrency)
        stack.callback(fleet.stop)
        fleet.start()
        injector = Injector(schedule(rng, args.duration, redis is not None), rng, fleet,
                            postgres, redis, folder, LEASE, queue)
        stack.callback(injector.stopping.set)
        setup = time.monotonic() - began
        print(f"setup {setup:.0f}s; logs in {folder}", flush=True)
        injector.start()
        log: list[str] = []
        published, counts = publish(args, rng, folder, provider.url, injector, log)
        injector.join(timeout=args.drain_timeout)
        drained = drain(args.drain_timeout, set(published))
        fleet.stop()
        checks, figures = collect(published, provider.provider, folder, injector.faults)
    elapsed = time.monotonic() - began
    faults = Counter(f.kind for f in injector.faults)
    title = {"command": "tests/chaos/run.py " + " ".join(argv or sys.argv[1:]),
             "seed": seed, "broker": f"{args.broker}, PostgreSQL 15",
             "workers": f"{args.workers} prefork x {args.concurrency} (+ replacements)",
             "jobs": f"{args.jobs} ({', '.join(KINDS)})",
             "messages published": f"{counts['copies sent']} "
                                   f"({counts['publish errors']} publishes failed, sent again)",
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
        print(f"skipped (no busy child at that moment): {dict(Counter(injector.skipped))}")
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
    print("\nchaos: " + ("every check passed" if ok else "FAILED"))
    return 0 if ok else 1


def delete_queues(names: list[str]) -> None:
    """Delete this run's own queues on the shared RabbitMQ (never anyone else's)."""
    from kombu import Connection

    with Connection(RABBITMQ) as conn:
        channel = conn.channel()
        for name in names:
            channel.queue_delete(name)


if __name__ == "__main__":
    sys.exit(main())
