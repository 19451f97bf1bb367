"""End to end: the producer's time included, CPU and WAL per task, against the plain task.

    python -m bench run end-to-end --n 2000 --rounds 5 --broker redis
    python -m bench run end-to-end --stack pgbouncer --n 1000 --rounds 5 --broker redis
    python -m bench run end-to-end --quick

``--stack`` (``--database`` here; bench/lib/stacks.py) is the stack every variant of the run uses, so ``django``
is the plain task on that same stack: ``postgres`` (directly, the default),
``pgbouncer`` (the same server behind a PgBouncer the run starts for itself, in
transaction pooling mode, the producer and the workers connected through it) or
``mysql`` (MariaDB, with the library's MySQL backend; ``raw``, ``floor``,
``pub-async``, ``floor-split`` and ``floor-split-hot`` are PostgreSQL's only; the other
floors run on every stack).

Each run starts a fresh prefork worker (``-c 2``, acks_late, reject on worker lost,
prefetch 1), warms it up with a few tasks, then this process publishes N messages while
the worker consumes them (no pre-filled queue). Measured per run:

- ``total_per_s``: N / (last task finished - first publish): producer and worker together;
  ``publish_per_s``: the producer alone; ``worker_per_s``: (N - 1) / (last - first finish);
- ``cpu_us_per_task`` per process group, from /proc (utime + stime): ``producer`` (this
  process, during its publish loop), ``worker`` (main process and pool children, and
  children reaped), ``postgres`` (every backend connected to the benchmark database) or
  on MariaDB ``mariadb`` (the whole mariadbd: shared with anything else using it),
  ``pgbouncer`` (its process, behind PgBouncer), ``broker`` (redis-server or RabbitMQ's
  beam.smp: shared with anything else using it);
- ``wal_bytes_per_task``: the WAL records of this database between two
  ``pg_current_wal_lsn()`` (read with pg_walinspect: records touching its relations and
  their transactions' commit records), and ``wal_bytes_per_task_cluster``, everything
  the server wrote meanwhile (other databases too): PostgreSQL only, read on a direct
  connection behind PgBouncer too; None on MariaDB;
- ``pg_sessions_per_task``: PostgreSQL sessions opened per task (the connection policy;
  behind PgBouncer the pooler's server sessions; None on MariaDB);
  ``pooler_transactions_per_task``: transactions PgBouncer passed (its SHOW STATS);
- ``latency_ms``: after the run, ``--latency`` tasks one at a time (each published once
  the one before finished, into an idle worker): from the publish to the worker's finish
  (its ``task_postrun``), the median; what one task takes as its caller feels it;
- the load average before and after.

Beside each ratio the summary says what a variant adds per task over its plain twin
(``django``, ``pub-plain`` for publishing alone, ``django-real`` for ``idem-real``), as
medians of the rounds' differences: ``overhead_cpu_us`` (CPU of every group together),
``overhead_wall_us`` (the run's time per task: what the rate loses) and
``overhead_latency_ms``.

Variants (``--variants``), interleaved in rounds (A B C ... A B C ...):

- ``raw``: plain Celery, no Django, one INSERT with psycopg on a kept connection
  (bench/lib/raw_app.py);
- ``django``: the plain task in the Django project (``bench.plain``, one ORM create);
- ``once``: celery-once ``QueueOnce`` (distinct keys);
- ``floor``: the bare protocol in raw SQL on a kept connection (claim upsert, INSERT,
  fenced commit: bench/lib/raw_app.py), no Django;
- ``floor-django``: the same claim and fenced commit in raw SQL inside the plain task, on
  Django's connection around its ORM create (``bench.floor_django``): what any
  effect-once layer adds to a Django task at the least, on every stack;
- ``floor-intent``: ``floor-django`` with the floor's intent written before each message
  leaves (one raw INSERT of the key, PENDING, on the producer's Django connection,
  committed and flushed: ``floor_sql.INTENT``), which the claim then takes: the least the
  default mode's shape (durability in the database) costs, on every stack;
- ``floor-bare``, ``floor-wide``, ``floor-split``, ``floor-split-hot`` (the last two
  PostgreSQL only; ``floor-bare-broker``: ``floor-bare`` without the intent, the claim
  inserting the row, as durability ``broker``'s): the layout floors, the library's
  statements in raw SQL on a candidate layout of the job row (bench/lib/layouts_sql.py: a
  bare table of the key and the moving columns, today's table, the split layout, the
  split layout with no index on its narrow table), with the values the library's row
  holds and its flushes (on PostgreSQL the intent flushed, the claim and commit not):
  against each other what a layout costs, ``floor-wide`` against ``idem`` what the
  library's Python adds;
- ``idem``: ``IdempotentTask`` (default mode); ``atomic``: ``atomic=True``;
- ``replay``: N publishes of N keys that already SUCCEEDED (the tasks ignore their
  results: each is answered at publish, no message leaves, celery_idem.replays);
  ``replay-sent``: the same with every message sent, as a replay whose result is stored
  or that carries a callback is: its worker reads the row and returns the outcome;
- ``idem-broker``: ``idem`` with ``CELERY_IDEM_DURABILITY = "broker"`` in the producer and
  the worker (no intent at publish; the claim inserts the row); ``atomic-broker``:
  ``atomic`` so; ``optimistic``: ``atomic="optimistic"`` so (the body, then one insert of
  the finished row in its transaction);
- ``django-real``, ``idem-real``: a realistic body beside the empty one, the same in both
  (five queries around the one effect: bench/lib/tasks.py ``_real``), plain and
  ``IdempotentTask``; ``idem-real``'s ratio and overheads are against ``django-real``;
- ``pub-plain``, ``pub-idem``: publishing alone, no worker (plain vs idempotent);
  ``pub-broker``: ``pub-idem`` with ``CELERY_IDEM_DURABILITY = "broker"``;
  ``pub-floor``: ``pub-plain`` after the floor's intent (``floor-intent``'s publish);
  ``pub-async``: ``pub-idem`` with the intent's commit not waiting for the WAL flush, a
  prototype of this module only (``unflushed_intents``), to measure what the flush costs.

Every Django worker runs under one connection policy, ``--policy`` (default ``keep``:
``CELERY_IDEM_WORKER_CONNECTIONS = "keep"`` with ``CONN_MAX_AGE`` 300; ``celery`` is the
fixup as shipped, a new session per task); ``name:keep`` or ``name:celery`` in
``--variants`` overrides it for one variant (e.g. ``django:celery``, to measure the
fixup's reconnect in the same rounds). Ratios divide by ``django`` (and by ``raw``) of
the same round.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.lib import common as c
from bench.lib.environment import environment
from bench.lib.measure import Groups
from bench.lib.stacks import DB_GROUP, POSTGRES_ONLY, STACKS, Stack, opened
from bench.lib.workers import WorkerProcess
from bench.suites import Options
from bench.suites.end_to_end_variants import (
    BASELINE,
    BROKER_DURABILITY,
    RAW_APP,
    REPLAYS,
    VARIANTS,
    effects,
    finished_keys,
    publish,
    reset,
)

QUESTION = ("How fast does a task run end to end (producer and worker timed together), "
            "against the plain task on the same stack?")
#: What ``--quick`` runs: the library's paths and their baseline.
QUICK_VARIANTS = "django,idem,atomic,replay"


def arguments(o: Options) -> list[str]:
    variants = o.variants or (QUICK_VARIANTS if o.quick else None)
    broker = o.broker or ("redis" if o.quick else None)
    return ["--database", o.stack, *(["--brokers", broker] if broker else []),
            *(["--variants", variants] if variants else []),
            *o.pick(o.n, 300, "--n"), *o.pick(o.rounds, 1, "--rounds")]


WARMUP = 4


# -- one run -------------------------------------------------------------------------------

def latencies(variant: str, keys: list[str], queue: str, timeout: float,
              worker: WorkerProcess) -> list[float]:
    """Each key's task published alone, once the one before finished: from the publish to
    its finish (the worker's mark), in ms."""
    out = []
    for key in keys:
        done = c.marks(queue)["n"]
        started = time.time()
        publish(variant, [key], queue)
        c.wait_for(lambda d=done: c.marks(queue)["n"] > d, timeout, f"{variant} latency",
                   interval=0.002, alive=worker.alive)
        out.append(1e3 * (c.marks(queue)["last"] - started))
    return out


def run_one(broker: str, variant: str, n: int, policy: str, timeout: float,
            stack: Stack, latency: int = 0) -> dict[str, Any]:
    queue = c.new_queue(f"honest-{variant}")
    tag = uuid.uuid4().hex[:8]
    keys = [f"{tag}-{i}" for i in range(n)]
    reset(variant)
    if variant == "once":
        c.clear_once_locks()
    if variant in REPLAYS:
        finished_keys(keys)
    worker = None
    if not variant.startswith("pub-"):
        worker = WorkerProcess(queue, concurrency=2, extra_env={
            "IDEM_WORKER_CONNECTIONS": policy, **(
                {"CELERY_IDEM_DURABILITY": '"broker"'} if variant in BROKER_DURABILITY else {})})
        if variant in RAW_APP:
            worker.args[worker.args.index("bench.lib.worker_app")] = "bench.lib.raw_app"
            worker.env.pop("DJANGO_SETTINGS_MODULE", None)  # no Django, no fixup
    load_before = c.loadavg()
    m: dict[str, float] = {"n": 0, "first": 0.0, "last": 0.0}
    lat: list[float] = []
    try:
        if worker is not None:
            worker.start()
            warm = [f"warm{tag}-{i}" for i in range(WARMUP)]
            publish("idem" if variant in REPLAYS else variant, warm, queue)
            c.wait_for(lambda: c.marks(queue)["n"] >= WARMUP, timeout, f"{variant} warm-up",
                       alive=worker.alive, on_fail=lambda: worker.log()[-3000:])  # type: ignore[union-attr]
            c.clear_marks(queue)
        groups = Groups(broker, worker, stack)
        sessions, pooled = stack.sessions_opened(), stack.pooler_transactions()
        before, lsn, t0 = groups.sample(), stack.wal_lsn(), time.time()
        publish_s, producer_cpu, sent = publish(variant, keys, queue)
        if worker is not None and sent:
            c.wait_for(lambda: c.marks(queue)["n"] >= sent, timeout, f"{variant} on {broker}",
                       alive=worker.alive, on_fail=lambda: worker.log()[-3000:])  # type: ignore[union-attr]
        after, wal = groups.sample(), stack.wal_bytes(lsn)
        opened, pooled_after = stack.sessions_opened(), stack.pooler_transactions()
        sessions = None if sessions is None or opened is None else opened - sessions
        m = c.marks(queue)  # the run's, before the latency tasks add theirs
        if worker is not None and sent and variant not in REPLAYS and latency:
            lat = latencies(variant, [f"{tag}-lat{i}" for i in range(latency)], queue,
                            timeout, worker)
    finally:
        if worker is not None:
            worker.stop()
        c.delete_queue(broker, queue)
    c.clear_marks(queue)
    if variant == "once":
        c.clear_once_locks()
    cpu = Groups.delta(before, after, n)
    cpu["producer"] = round(1e6 * producer_cpu / n, 1)
    made = effects(tag)
    expected = 0 if variant in REPLAYS or variant.startswith("pub-") else n + len(lat)
    # Without a message to run (a replay answered at publish), publishing was the work.
    total_s = (m["last"] - t0) if worker is not None and sent else publish_s
    span = m["last"] - m["first"]
    result = {
        "database": stack.name, "broker": broker, "variant": variant, "policy": policy, "n": n,
        "total_per_s": round(n / total_s, 1) if total_s > 0 else None,
        "publish_per_s": round(n / publish_s, 1) if publish_s > 0 else None,
        "worker_per_s": round((sent - 1) / span, 1) if worker is not None and span > 0 else None,
        "messages_per_publish": round(sent / n, 3),
        "cpu_us_per_task": cpu,
        "cpu_us_per_task_total": round(sum(cpu.values()), 1),
        "wal_bytes_per_task": round(wal[1] / n, 1) if wal[1] is not None else None,
        "wal_bytes_per_task_cluster": round(wal[0] / n, 1) if wal[0] is not None else None,
        "pg_sessions_per_task": round(sessions / n, 3) if sessions is not None else None,
        "pooler_transactions_per_task": round((pooled_after - pooled) / n, 2)
        if pooled is not None and pooled_after is not None else None,
        "latency_ms": round(c.median(lat), 2) if lat else None,
        "effects": made, "exactly_once": made == expected,
        "loadavg_before": load_before, "loadavg_after": c.loadavg(),
    }
    c.log(f"{stack.name:9} {broker:8} {variant:9} n={n} total {result['total_per_s']}/s publish "
          f"{result['publish_per_s']}/s worker {result['worker_per_s']}/s cpu "
          f"{result['cpu_us_per_task_total']} us wal {result['wal_bytes_per_task']} B "
          f"load {result['loadavg_after'][0]}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="tasks per run (default 2000)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--brokers", default="redis,rabbitmq")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--policy", default="keep", choices=("keep", "celery"),
                    help="the Django workers' connection policy (default keep)")
    ap.add_argument("--database", default="postgres", choices=STACKS,
                    help="the stack every variant runs on (bench/lib/stacks.py): PostgreSQL "
                         "directly (default), behind a PgBouncer of the run's own in "
                         "transaction mode, or MariaDB")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run")
    ap.add_argument("--latency", type=int, default=20,
                    help="tasks run one at a time after each run, for its latency (0: none)")
    ap.add_argument("--out", default=None, help="results file")
    ap.add_argument("--print", dest="show", default=None, metavar="FILE",
                    help="print the table of a results file and exit")
    args = ap.parse_args(argv)
    if args.show:
        import json

        print_table(json.loads(Path(args.show).read_text()))
        return 0
    brokers = [b for b in args.brokers.split(",") if b]
    variants = [v for v in args.variants.split(",") if v]
    for b in brokers:
        if b not in c.BROKERS:
            raise SystemExit(f"unknown broker {b!r}")
    for v in variants:
        name, _, policy = v.partition(":")
        if name not in VARIANTS or policy not in ("", "keep", "celery"):
            raise SystemExit(f"unknown variant {v!r}; choose from {VARIANTS}, each "
                             "optionally with :keep or :celery")
        if args.database == "mysql" and name in POSTGRES_ONLY:
            raise SystemExit(f"variant {name!r} runs on PostgreSQL only (not --database mysql)")
    c.configure(brokers[0])
    # A SIGTERM unwinds like ^C, so the stack's PgBouncer is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with opened(args.database) as stack:
        return measure(args, brokers, variants, stack)


def measure(args: argparse.Namespace, brokers: list[str], variants: list[str],
            stack: Stack) -> int:
    c.setup_django()
    import bench.lib.worker_app  # noqa: F401 - the producer needs its configuration (ONCE)

    env = environment()
    env["stack"] = stack.describe()
    timeout = args.timeout or (90 + 0.05 * args.n)
    runs: list[dict[str, Any]] = []
    started = time.time()
    for broker in brokers:
        _switch_broker(broker)
        for rnd in range(args.rounds):
            for variant in variants:
                name, _, policy = variant.partition(":")
                r = run_one(broker, name, args.n, policy or args.policy, timeout, stack,
                            args.latency)
                r["variant"], r["kind"], r["round"] = variant, name, rnd
                runs.append(r)
    data = {
        "benchmark": "honest", "command": c.command_line(), "environment": env,
        "settings": {"database": stack.name, "n": args.n, "rounds": args.rounds,
                     "policy": args.policy,
                     "concurrency": 2, "pool": "prefork", "prefetch_multiplier": 1,
                     "acks_late": True, "warmup": WARMUP, "latency_tasks": args.latency,
                     "measure": "publish while the worker consumes; total = first publish "
                                "to last finish"},
        "elapsed_s": round(time.time() - started, 1), "loadavg_end": c.loadavg(),
        "summary": summarize(runs), "runs": runs,
    }
    c.write_result("honest" if stack.name == "postgres" else f"honest-{stack.name}", data,
                   args.out)
    print_table(data)
    bad = [r for r in runs if not r["exactly_once"] and r["kind"] not in ("raw", "django")]
    if bad:
        c.log(f"exactly-once violated in {len(bad)} runs")
        return 1
    return 0


def _switch_broker(broker: str) -> None:
    """Point this (producer) process's Celery app at ``broker``."""
    from bench.lib.worker_app import app

    os.environ["IDEM_BROKER"] = c.BROKERS[broker]
    os.environ["BENCH_BROKER"] = broker
    app.conf.broker_url = c.BROKERS[broker]
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None



def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    rounds: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for r in runs:
        rounds.setdefault((r["broker"], r["round"]), {})[r["variant"]] = r
    for (broker, _), by_variant in sorted(rounds.items()):
        for variant, r in by_variant.items():
            e = summary.setdefault(broker, {}).setdefault(variant, {
                "total_per_s": [], "publish_per_s": [], "worker_per_s": [],
                "ratio_to_django": [], "ratio_to_raw": [], "cpu": [], "wal": [], "wal_cluster": [],
                "sessions": [], "latency_ms": [], "overhead_cpu_us": [], "overhead_wall_us": [],
                "overhead_latency_ms": []})
            rate = "publish_per_s" if variant.startswith("pub-") else "total_per_s"
            for key in ("total_per_s", "publish_per_s", "worker_per_s", "latency_ms"):
                if r.get(key) is not None:
                    e[key].append(r[key])
            base = by_variant.get(BASELINE.get(r.get("kind", variant), "pub-plain" if
                                               variant.startswith("pub-") else "django"))
            if base and base[rate] and r[rate]:
                e["ratio_to_django"].append(round(r[rate] / base[rate], 3))
            if base and base is not r:
                # What the variant adds per task over its plain twin, in this round.
                e["overhead_cpu_us"].append(round(
                    r["cpu_us_per_task_total"] - base["cpu_us_per_task_total"], 1))
                if base[rate] and r[rate]:
                    e["overhead_wall_us"].append(round(1e6 / r[rate] - 1e6 / base[rate], 1))
                if r.get("latency_ms") is not None and base.get("latency_ms") is not None:
                    e["overhead_latency_ms"].append(round(r["latency_ms"] - base["latency_ms"],
                                                          2))
            if "raw" in by_variant and by_variant["raw"]["total_per_s"] and r["total_per_s"] \
                    and not variant.startswith("pub-"):
                e["ratio_to_raw"].append(round(r["total_per_s"] / by_variant["raw"]["total_per_s"], 3))
            e["cpu"].append(r["cpu_us_per_task"])
            for key, into in (("wal_bytes_per_task", "wal"), ("pg_sessions_per_task", "sessions"),
                              ("wal_bytes_per_task_cluster", "wal_cluster")):
                if r[key] is not None:  # None: not measured (MariaDB)
                    e[into].append(r[key])
    for variants in summary.values():
        for e in variants.values():
            for key in ("total_per_s", "publish_per_s", "worker_per_s", "ratio_to_django",
                        "ratio_to_raw", "wal", "wal_cluster", "sessions", "latency_ms",
                        "overhead_cpu_us", "overhead_wall_us", "overhead_latency_ms"):
                e[f"median_{key}"] = round(c.median(e[key]), 3) if e[key] else None
            groups = sorted({g for cpu in e["cpu"] for g in cpu})
            e["median_cpu_us"] = {g: round(c.median(cpu.get(g, 0) for cpu in e["cpu"]), 1)
                                  for g in groups}
            del e["cpu"]
    return summary


def print_table(data: dict[str, Any]) -> None:
    s = data["settings"]
    database = s.get("database", "postgres")  # files from before --database: PostgreSQL
    print(f"database={database} n={s['n']} rounds={s['rounds']} policy={s['policy']} "
          f"load {data['environment']['loadavg']} -> {data['loadavg_end']}")
    head = (f"  {'variant':10} {'total/s':>8} {'x django':>8} {'x raw':>6} {'publish/s':>9} "
            f"{'worker/s':>8} {'cpu prod':>8} {'worker':>7} {'db':>7} {'pooler':>7} "
            f"{'broker':>7} {'WAL B':>7} {'sess':>5} {'+CPU us':>8} {'+wall us':>8} "
            f"{'lat ms':>6} {'+lat ms':>7}")
    db = DB_GROUP[database]
    for broker, variants in data["summary"].items():
        print(f"\n{database}, {broker} (medians; CPU µs ({db}; PgBouncer as pooler), WAL bytes"
              f" of this database and PostgreSQL sessions opened, per task; None: n/a)\n{head}")
        for name, e in variants.items():
            cpu = e["median_cpu_us"]
            print(f"  {name:10} {e['median_total_per_s']!s:>8} {e['median_ratio_to_django']!s:>8} "
                  f"{e['median_ratio_to_raw']!s:>6} {e['median_publish_per_s']!s:>9} "
                  f"{e['median_worker_per_s']!s:>8} {cpu.get('producer')!s:>8} "
                  f"{cpu.get('worker')!s:>7} {cpu.get(db)!s:>7} {cpu.get('pgbouncer')!s:>7} "
                  f"{cpu.get('broker')!s:>7} {e['median_wal']!s:>7} "
                  f"{e.get('median_sessions')!s:>5} {e.get('median_overhead_cpu_us')!s:>8} "
                  f"{e.get('median_overhead_wall_us')!s:>8} {e.get('median_latency_ms')!s:>6} "
                  f"{e.get('median_overhead_latency_ms')!s:>7}")
