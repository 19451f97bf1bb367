"""CPU per publish and per task, in this process: the library's Python cost, profiled.

    python -m bench run cpu --n 2000 --rounds 5
    python -m bench run cpu --n 500 --rounds 1 -- --profile publish-idem

The same task shape both ways, ``ship(order_id, amount, note="")``, each body writing
one Effect row (one ORM INSERT): ``cpu.plain`` (the project's plain Celery task class,
``DjangoTask``) and ``cpu.idem`` (``IdempotentTask``, default mode, key template
``"order/{order_id}"``). Per round, interleaved (plain, idem, plain, idem):

- ``publish``: ``apply_async((order_id, amount), {"note": ...})`` N times through one
  producer (``producer_or_acquire``, as a web process publishing in a loop), into kombu's
  in-memory transport (``--broker memory``, the default: the broker costs nothing, so the
  difference is the producer's) or a real Redis (``--broker redis``: the run's own queue,
  deleted afterwards). The idempotent publish writes its PENDING intent, outside a
  transaction, on the process's bookkeeping connection (PostgreSQL; on MariaDB on
  Django's own), or none with ``--durability broker``;
- ``task``: each published message run through Celery's task tracer
  (``celery.app.trace.build_tracer``, what a pool child runs) in this process, with the
  request a worker builds from it (the key header for the idempotent one), under the
  ``keep`` connection policy (``CELERY_IDEM_WORKER_CONNECTIONS = "keep"``, CONN_MAX_AGE
  300: no reconnect per task), as in the end-to-end suite.

Measured: this process's CPU (``time.process_time``: user + system, PostgreSQL's and the
broker's CPU are not in it) and wall time, per operation; medians over rounds and the
ratio idempotent / plain. ``--profile publish-idem|task-idem|publish-plain|task-plain``
runs that loop once more under cProfile (timed in CPU time) and prints the top entries
(cumulative and own time), and writes no results file unless ``--out`` names one;
``--dump`` keeps the stats for pstats. ``--durability broker`` runs both idempotent loops
with ``CELERY_IDEM_DURABILITY = "broker"``: no intent at publish, the worker's claim
inserts the row. ``--database`` is the stack, as
``bench/lib/stacks.py`` opens it: ``postgres`` (the default; ``IDEM_PG_NAME``, default
``idem_bench``), ``pgbouncer`` (a PgBouncer of its own in front of it) or ``mysql``
(MariaDB, the library's MySQL backend; ``IDEM_MYSQL_NAME``, default the same name). Only
this process's CPU is measured: the servers' and the pooler's are not in it.

``--instructions`` counts instead, for a busy machine: the run goes under valgrind's
callgrind (``bench/lib/callgrind.py``) and each loop reports the **instructions** this
process executed per operation (a deterministic count, whatever the load; callgrind
runs ~50x slower, so use a small ``--n``, e.g. ``--n 200 --rounds 2``). Medians and
ratios are then of ``instr`` instead of ``cpu_us`` and ``wall_us``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.lib import callgrind, stacks
from bench.lib import common as c
from bench.lib.environment import environment
from bench.suites import Options, refuse

QUESTION = "How much CPU does this process spend per publish and per task?"
STACKS = ("postgres", "pgbouncer", "mysql")


def arguments(o: Options) -> list[str]:
    refuse("cpu", "--variants", o.variants)
    return ["--database", o.stack, *(["--broker", o.broker] if o.broker else []),
            *o.pick(o.n, 100, "--n"), *o.pick(o.rounds, 1, "--rounds")]


LOOPS = ("publish-plain", "publish-idem", "task-plain", "task-idem")
WARMUP = 50
#: Set in the process running under callgrind (``--instructions``): loops are counted.
COUNTER: callgrind.Counter | None = None


def define_tasks(app: Any) -> tuple[Any, Any]:
    """The plain and the idempotent task, one signature, one INSERT each."""
    from celery_idem import IdempotentTask
    from django_app.effects.models import Effect

    def write(order_id: int, amount: float, note: str) -> None:
        Effect.objects.create(key=f"{order_id}", pid=os.getpid())

    @app.task(name="cpu.plain", ignore_result=True)
    def plain(order_id: int, amount: float, note: str = "") -> int:
        write(order_id, amount, note)
        return order_id

    @app.task(name="cpu.idem", base=IdempotentTask, ignore_result=True,
              idempotency_key="order/{order_id}")
    def idem(order_id: int, amount: float, note: str = "") -> int:
        write(order_id, amount, note)
        return order_id

    return plain, idem


def measure(fn: Callable[[], None], n: int, name: str = "loop") -> dict[str, float]:
    if COUNTER is not None:
        return {"instr": COUNTER.count(name, fn) / n}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    fn()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"cpu_us": 1e6 * cpu / n, "wall_us": 1e6 * wall / n}


def profile(fn: Callable[[], None], top: int, dump: str | None = None) -> str:
    """The top entries of ``fn`` under cProfile, timed in this process's CPU time (a
    wait for PostgreSQL or the broker costs nothing here, as in the measurement)."""
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    fn()
    prof.disable()
    if dump:
        prof.dump_stats(dump)
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).strip_dirs()
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def purge(queue: str) -> None:
    from bench.lib.worker_app import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(queue)


def round_(tasks: dict[str, Any], n: int, queue: str, base: int, profiled: str | None = None,
           top: int = 40, dump: str | None = None) -> dict[str, dict[str, float]]:
    """One round: publish n of each, then run each's messages; interleaved."""
    from celery import signals

    c.reset_tables()
    out: dict[str, dict[str, float]] = {}
    sent: dict[str, Sent] = {}
    for kind in ("plain", "idem"):
        ids = [base + i for i in range(n)]
        sent[kind] = Sent()
        signals.after_task_publish.connect(sent[kind], weak=False)
        try:
            loop = publish_loop(tasks[kind], ids, queue)
            if profiled == f"publish-{kind}":
                print(profile(loop, top, dump))
            else:
                out[f"publish-{kind}"] = measure(loop, n, f"publish-{kind}")
        finally:
            signals.after_task_publish.disconnect(sent[kind])
        base += n
    purge(queue)
    for kind in ("plain", "idem"):
        loop = task_loop(tasks[kind], sent[kind].messages, queue)
        if profiled == f"task-{kind}":
            print(profile(loop, top, dump))
        else:
            out[f"task-{kind}"] = measure(loop, n, f"task-{kind}")
    _check_effects(2 * n)
    return out


def _check_effects(expected: int) -> None:
    """Every task ran its body once: one Effect row each (none replayed, none lost)."""
    from django_app.effects.models import Effect

    found = Effect.objects.count()
    if found != expected:
        raise RuntimeError(f"expected {expected} effect rows, found {found}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="publishes and tasks per loop")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--broker", choices=("memory", "redis"), default="memory")
    ap.add_argument("--profile", choices=LOOPS, default=None,
                    help="after the rounds, run this loop under cProfile and print the top")
    ap.add_argument("--top", type=int, default=40, help="entries --profile prints")
    ap.add_argument("--dump", default=None, help="also write the --profile stats here (pstats)")
    ap.add_argument("--durability", choices=("database", "broker"), default="database",
                    help="CELERY_IDEM_DURABILITY for the idempotent loops (default database)")
    ap.add_argument("--database", choices=stacks.STACKS, default="postgres")
    ap.add_argument("--out", default=None)
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions per operation under callgrind, not CPU time")
    args = ap.parse_args(argv)
    global COUNTER
    if args.instructions and not callgrind.active():
        var = Path(os.environ.get("IDEM_VAR_DIR", "/tmp/idem-bench")) / "callgrind"
        return callgrind.run_under(["-m", "bench.suites.cpu", *(sys.argv[1:] if argv is None else argv)],
                                    var)
    if args.instructions:
        COUNTER = callgrind.Counter()

    queue = c.new_queue("bench-cpu")
    c.configure("redis", queue=queue)
    with stacks.opened(args.database):
        return _run(args, queue)


def _run(args: argparse.Namespace, queue: str) -> int:
    os.environ["IDEM_WORKER_CONNECTIONS"] = "keep"
    if args.broker == "memory":
        os.environ["IDEM_BROKER"] = "memory://"
    os.environ["IDEM_RESULTS"] = "cache+memory://"
    c.setup_django()
    from django.test import override_settings

    from bench.lib.worker_app import app
    from celery_idem.worker_connections import take_over

    override_settings(CELERY_IDEM_DURABILITY=args.durability).enable()  # this process's
    take_over(app)  # the keep policy's prerun/postrun receivers, as in a worker
    tasks = dict(zip(("plain", "idem"), define_tasks(app), strict=True))
    c.reset_tables()
    env = environment()
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in LOOPS}
    metrics = ("instr",) if COUNTER is not None else ("cpu_us", "wall_us")
    base = 0
    try:
        round_(tasks, WARMUP, queue, base)  # connections, prepared statements, imports
        base += 2 * WARMUP
        for rnd in range(args.rounds):
            for name, value in round_(tasks, args.n, queue, base).items():
                samples[name].append(value)
            base += 2 * args.n
            c.log(f"round {rnd + 1}/{args.rounds}: " + ", ".join(
                f"{k} {v[-1][metrics[0]]:.0f} {metrics[0]}" for k, v in samples.items()))
        if args.profile:
            round_(tasks, args.n, queue, base, profiled=args.profile, top=args.top,
                   dump=args.dump)
    finally:
        if args.broker == "redis":
            c.delete_queue("redis", queue)
    median = {name: {m: round(c.median(s[m] for s in runs), 1) for m in metrics}
              for name, runs in samples.items() if runs}
    ratios = {side: _ratios(median[f"{side}-plain"], median[f"{side}-idem"])
              for side in ("publish", "task") if f"{side}-idem" in median}
    data = {"benchmark": "cpu_profile", "command": c.command_line(), "environment": env,
            "settings": {"n": args.n, "rounds": args.rounds, "broker": args.broker,
                         "database": args.database,
                         "durability": args.durability,
                         "measure": "callgrind instructions" if COUNTER else "process_time"},
            "by_round": {k: [{m: round(x, 1) for m, x in s.items()} for s in v]
                         for k, v in samples.items()},
            "median": median, "ratios": ratios, "loadavg_end": c.loadavg()}
    if args.out or not args.profile:  # a profiling run keeps the committed results
        c.write_result("cpu_profile", data, args.out)
    print(f"\n{'loop':16} " + " ".join(f"{m:>10}" for m in metrics))
    for name, m in median.items():
        print(f"{name:16} " + " ".join(f"{m[k]:10.1f}" for k in metrics))
    for side, r in ratios.items():
        print(f"{side}: " + ", ".join(f"{k} {v}" for k, v in r.items()))
    return 0


def _ratios(plain: dict[str, float], idem: dict[str, float]) -> dict[str, float]:
    """Idempotent against plain, in this run: CPU (or instructions) and throughput."""
    if "instr" in plain:
        return {"instr_idem_over_plain": round(idem["instr"] / plain["instr"], 3),
                "instr_extra": round(idem["instr"] - plain["instr"])}
    return {"cpu_idem_over_plain": round(idem["cpu_us"] / plain["cpu_us"], 3),
            "cpu_extra_us": round(idem["cpu_us"] - plain["cpu_us"], 1),
            "throughput_idem_over_plain": round(plain["wall_us"] / idem["wall_us"], 3)}



class Sent:
    """Captures what each publish handed the broker (the worker side runs it)."""

    def __init__(self) -> None:
        self.messages: list[tuple[dict[str, Any], Any]] = []

    def __call__(self, sender: Any = None, headers: Any = None, body: Any = None,
                 **_: Any) -> None:
        self.messages.append((dict(headers or {}), body))


def publish_loop(task: Any, ids: list[int], queue: str) -> Callable[[], None]:
    from bench.lib.worker_app import app

    def loop() -> None:
        with app.producer_or_acquire() as producer:
            for i in ids:
                task.apply_async((i, 12.5), {"note": "gift"}, queue=queue, producer=producer)
    return loop


_tracers: dict[str, Any] = {}


def task_loop(task: Any, messages: list[tuple[dict[str, Any], Any]],
              queue: str) -> Callable[[], None]:
    """Run each message as a pool child would: the tracer, with the worker's request."""
    from celery.app.trace import build_tracer

    from bench.lib.worker_app import app

    task = app.tasks[task.name]  # the task itself, as a worker has it (not a proxy)
    tracer = _tracers.get(task.name)
    if tracer is None:
        tracer = _tracers[task.name] = build_tracer(
            task.name, task, app=app, eager=False, propagate=True, hostname="cpu@local")
    requests = []
    for headers, body in messages:
        args, kwargs, embed = body
        request = {**headers, "args": args, "kwargs": kwargs, "hostname": "cpu@local",
                   "is_eager": False, "delivery_info": {
                       "exchange": "", "routing_key": queue, "priority": 0,
                       "redelivered": False},
                   "reply_to": None, "correlation_id": headers["id"], **embed}
        # A worker puts the custom headers on the request (and under "headers").
        request["headers"] = {k: v for k, v in headers.items() if k.startswith("celery_idem")}
        requests.append((headers["id"], args, kwargs, request))

    def loop() -> None:
        for task_id, args, kwargs, request in requests:
            out = tracer(task_id, args, kwargs, request)
            if out.info is not None and isinstance(out.info, BaseException):
                raise out.info
    return loop


if __name__ == "__main__":  # the re-run under callgrind
    sys.exit(main())
