"""What each path asks of the database and of the CPU, counted: figures the machine's load
does not change.

    python -m bench run counts -- --stacks postgres,pgbouncer,mysql,sqlite
    python -m bench run counts --stack mysql --n 10 -- --no-instructions

Per stack (each in a process of its own: PostgreSQL directly, behind a PgBouncer of the
run's own, MariaDB, SQLite) and per path, in this process with kombu's in-memory broker
(what a publish hands the broker is captured and run through Celery's tracer, as a
pool child runs it, under the ``keep`` connection policy): the producer's publish, plain
and idempotent (default mode, inside ``atomic()`` with the outbox, broker durability, a
finished key answered at publish), and the worker's task, plain and idempotent (default
mode, ``atomic=True``, broker durability, ``atomic="optimistic"`` with broker durability,
a duplicate of a finished key). One task shape,
``ship(order_id, amount, note="")``, whose body writes one row (an ORM INSERT).

Counted per operation, after a warm-up (bench/lib/counting.py says how, per database):
statements (transaction control included, and apart), round trips, commits that
changed a row, and of those the ones that waited for a flush; on PostgreSQL the WAL
bytes without full-page images, index entries written, heap updates and HOT updates.

Then, unless ``--no-instructions``, the same paths again in a process under valgrind's
callgrind (bench/lib/callgrind.py): the **instructions** this process executes per
operation, and against the plain path of the same side. For the idempotent paths whose
transactions are the library's own (not the outbox, which rides the caller's), also the
instructions of the very same statements sent again through the bare driver
(bench/lib/replay.py, "floor"): what a path costs above its plain twin and that floor
is the library's own Python. Instructions convert to microseconds at the rate this
machine ran the plain paths in this run (their CPU time over their instructions), an
estimate: CPU time depends on the load, instructions do not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.lib import callgrind
from bench.lib import common as c
from bench.suites import Options, refuse

QUESTION = ("Per path and stack: statements, round trips, commits, flushes, WAL, index "
            "entries, HOT updates, and this process's instructions against the plain task?")
STACKS = ("postgres", "pgbouncer", "mysql", "sqlite")
SIDES = {"producer": "publish, plain", "worker": "task, plain"}
#: Path name -> (side, floor: its statements' transactions are the library's own).
PATHS: dict[str, tuple[str, bool]] = {
    "publish, plain": ("producer", False),
    "publish": ("producer", True),
    "publish in atomic(), plain (on commit)": ("producer", False),
    "publish in atomic() (outbox)": ("producer", False),
    "publish, durability broker": ("producer", True),
    "publish of a finished key": ("producer", True),
    "task, plain": ("worker", False),
    "task": ("worker", True),
    "task, atomic=True": ("worker", True),
    "task, durability broker": ("worker", True),
    "task, optimistic, durability broker": ("worker", True),
    "task, duplicate of a finished key": ("worker", True),
}
#: The plain path each path is measured against.
BASELINE = {name: ("publish in atomic(), plain (on commit)" if "atomic()" in name
                   else SIDES[side]) for name, (side, _) in PATHS.items()}
WARMUP = 5
COUNT_COLUMNS = ("statements", "transaction_control", "round_trips", "commits", "flushes",
                 "wal_bytes", "index_entries", "updates", "hot_updates")


def arguments(o: Options) -> list[str]:
    refuse("counts", "--variants", o.variants)
    refuse("counts", "--rounds", o.rounds)
    refuse("counts", "--broker", o.broker)
    return ["--stacks", o.stack, *o.pick(o.n, 5, "--n")]


# -- the paths -------------------------------------------------------------------------------

class Paths:
    """The tasks, a producer, and each path as (prepare, operations) over order ids."""

    def __init__(self, app: Any, producer: Any = None) -> None:
        from celery import signals

        from celery_idem import IdempotentTask
        from django_app.effects.models import Effect

        def write(order_id: int) -> None:
            Effect.objects.create(key=f"{order_id}", pid=os.getpid())

        @app.task(name="counts.plain", ignore_result=True)
        def plain(order_id: int, amount: float, note: str = "") -> int:
            write(order_id)
            return order_id

        @app.task(name="counts.idem", base=IdempotentTask, ignore_result=True,
                  idempotency_key="order/{order_id}")
        def idem(order_id: int, amount: float, note: str = "") -> int:
            write(order_id)
            return order_id

        @app.task(name="counts.atomic", base=IdempotentTask, ignore_result=True,
                  atomic=True, idempotency_key="order/{order_id}")
        def atomic(order_id: int, amount: float, note: str = "") -> int:
            write(order_id)
            return order_id

        @app.task(name="counts.optimistic", base=IdempotentTask, ignore_result=True,
                  atomic="optimistic", idempotency_key="order/{order_id}")
        def optimistic(order_id: int, amount: float, note: str = "") -> int:
            write(order_id)
            return order_id

        self.app, self.write = app, write
        self.plain, self.idem, self.atomic = plain, idem, atomic
        self.optimistic = optimistic
        self.pooled = producer is None
        self.producer = app.producer_pool.acquire(block=True) if producer is None else producer
        self.sent: list[tuple[dict[str, Any], Any]] | None = None
        self.tracers: dict[str, Any] = {}
        signals.after_task_publish.connect(self._sent, weak=False)

    def _sent(self, sender: Any = None, headers: Any = None, body: Any = None,
              **_: Any) -> None:
        if self.sent is not None:
            self.sent.append((dict(headers or {}), body))

    def close(self) -> None:
        from celery import signals

        signals.after_task_publish.disconnect(self._sent)
        if self.pooled:
            self.producer.release()

    # -- publishing and running ---------------------------------------------------------

    def publish(self, task: Any, order_id: int, suffix: str = "") -> Any:
        return task.apply_async((order_id, 12.5), {"note": "gift"}, producer=self.producer,
                                task_id=f"counts-{task.name}-{order_id}{suffix}")

    def messages(self, task: Any, ids: list[int]) -> list[tuple[dict[str, Any], Any]]:
        """Publish each of ``ids``; what each handed the broker."""
        self.sent = []
        try:
            for i in ids:
                self.publish(task, i)
            return self.sent
        finally:
            self.sent = None

    def runner(self, task: Any, message: tuple[dict[str, Any], Any]) -> Callable[[], None]:
        """Run ``message`` as a pool child would: the tracer, with the worker's request."""
        from celery.app.trace import build_tracer

        tracer = self.tracers.get(task.name)
        if tracer is None:
            tracer = self.tracers[task.name] = build_tracer(
                task.name, self.app.tasks[task.name], app=self.app, eager=False,
                propagate=True, hostname="counts@local")
        headers, body = message
        args, kwargs, embed = body
        queue = self.app.conf.task_default_queue
        request = {**headers, "args": args, "kwargs": kwargs, "hostname": "counts@local",
                   "is_eager": False, "delivery_info": {
                       "exchange": "", "routing_key": queue, "priority": 0,
                       "redelivered": False},
                   "reply_to": None, "correlation_id": headers["id"], **embed,
                   "headers": {k: v for k, v in headers.items() if k.startswith("celery_idem")}}

        def run() -> None:
            out = tracer(headers["id"], args, kwargs, request)
            if isinstance(out.info, BaseException):
                raise out.info
        return run

    def finished(self, task: Any, ids: list[int]) -> list[tuple[dict[str, Any], Any]]:
        messages = self.messages(task, ids)
        for message in messages:
            self.runner(task, message)()
        return messages

    # -- each path: prepare (not measured), then one callable per operation --------------

    def operations(self, name: str, ids: list[int]) -> list[Callable[[], Any]]:
        from django.db import transaction

        def outbox(task: Any, i: int) -> Callable[[], None]:
            def op() -> None:
                with transaction.atomic():
                    self.write(-i)
                    if task is self.plain:
                        task.apply_async_on_commit((i, 12.5), {"note": "gift"},
                                                   producer=self.producer,
                                                   task_id=f"counts-{task.name}-{i}")
                    else:
                        self.publish(task, i)
            return op

        if name in ("publish, plain", "publish", "publish, durability broker"):
            task = self.plain if name == "publish, plain" else self.idem
            return [lambda i=i, t=task: self.publish(t, i) for i in ids]
        if "atomic()" in name:
            task = self.plain if "plain" in name else self.idem
            return [outbox(task, i) for i in ids]
        if name == "publish of a finished key":
            self.finished(self.idem, ids)
            return [lambda i=i: self.publish(self.idem, i, "-again") for i in ids]
        if name == "task, duplicate of a finished key":
            return [self.runner(self.idem, m) for m in self.finished(self.idem, ids)]
        task = {"task, plain": self.plain, "task, atomic=True": self.atomic,
                "task, optimistic, durability broker": self.optimistic}.get(name, self.idem)
        return [self.runner(task, m) for m in self.messages(task, ids)]


@contextmanager
def path_settings(name: str) -> Iterator[None]:
    """CELERY_IDEM_DURABILITY = "broker" for the paths of broker durability. Set on
    Django's settings themselves, not with override_settings: under it every read of
    Django's settings (each of Celery's own, several a publish) takes another step."""
    if "durability broker" not in name:
        yield
        return
    from django.conf import settings

    from celery_idem.conf import settings as idem_settings

    had = getattr(settings, "CELERY_IDEM_DURABILITY", None)
    settings.CELERY_IDEM_DURABILITY = "broker"
    idem_settings.__dict__.pop("DURABILITY", None)
    try:
        yield
    finally:
        if had is None:
            del settings.CELERY_IDEM_DURABILITY
        else:
            settings.CELERY_IDEM_DURABILITY = had
        idem_settings.__dict__.pop("DURABILITY", None)


def run_all(ops: list[Callable[[], Any]]) -> Callable[[], None]:
    def loop() -> None:
        for op in ops:
            op()
    return loop


class Ids:
    """Order ids, a fresh block per call (``same`` gives the last block again)."""

    def __init__(self) -> None:
        self.next = 1

    def block(self, n: int) -> list[int]:
        self.last = list(range(self.next, self.next + n))
        self.next += n
        return self.last


# -- one stack, counted ---------------------------------------------------------------------

def setup(stack: str) -> Paths:
    os.environ["IDEM_WORKER_CONNECTIONS"] = "keep"
    c.setup_django()
    from bench.lib.worker_app import app
    from celery_idem.worker_connections import take_over

    take_over(app)
    c.reset_tables()
    return Paths(app)


def count_stack(stack: str, n: int) -> dict[str, Any]:
    from django.db import connection

    from bench.lib import counting

    paths = setup(stack)
    ids = Ids()
    direct = counting.direct_connection() if connection.vendor == "postgresql" else None
    out: dict[str, Any] = {}
    try:
        if direct is not None:
            counting.pg_triggers(direct, install=True)
        for name in PATHS:
            out[name] = count_path(paths, ids, name, n, direct)
            c.log(f"{stack}: {name}: " + ", ".join(
                f"{k} {out[name].get(k)}" for k in COUNT_COLUMNS if k in out[name]))
        cpu = cpu_of_plain(paths, ids, max(n, 50))
    finally:
        if direct is not None:
            counting.pg_triggers(direct, install=False)
            direct.close()
        paths.close()
        c.close_django_connections()
    return {"counts": out, "cpu_us_plain": cpu}


def count_path(paths: Paths, ids: Ids, name: str, n: int, direct: Any) -> dict[str, Any]:
    """Path ``name``'s counts per operation, over ``n`` after a warm-up (``direct``: the
    PostgreSQL connection of ``counting.PostgresCounter``, with the probes installed)."""
    from bench.lib import counting

    with path_settings(name):
        run_all(paths.operations(name, ids.block(WARMUP)))()
        ops = paths.operations(name, ids.block(n))
        return counting.count(run_all(ops), n, direct)


def cpu_of_plain(paths: Paths, ids: Ids, n: int, repeats: int = 3) -> dict[str, float]:
    """This process's CPU µs per operation of the plain paths (the lowest of
    ``repeats``: the least disturbed by the load), to convert instructions."""
    out = {}
    for name in SIDES.values():
        samples = []
        for _ in range(repeats):
            ops = paths.operations(name, ids.block(n))
            started = time.process_time()
            run_all(ops)()
            samples.append(1e6 * (time.process_time() - started) / n)
        out[name] = round(min(samples), 1)
    return out


# -- one stack, instructions (the process under callgrind) ----------------------------------

def instructions_stack(stack: str, n: int) -> dict[str, Any]:
    from django.conf import settings

    from bench.lib import replay
    from celery_idem.conf import settings as idem_settings

    counter = callgrind.Counter()
    paths = setup(stack)
    ids = Ids()
    out: dict[str, Any] = {}
    # Under callgrind a run takes many minutes: no connection may reach its maximum age
    # and reconnect inside a counted loop (a reconnect is a million instructions).
    from django.db import connections

    for conn in connections.all():
        conn.settings_dict["CONN_MAX_AGE"] = None
        conn.close_at = None  # one already open
    # Not override_settings: with it every read of Django's settings (each of Celery's
    # own, several a publish) takes another step, and the counts would be its.
    settings.CELERY_IDEM_CONNECTION_MAX_AGE = 10**9  # before the bookkeeping one opens
    idem_settings.__dict__.pop("CONNECTION_MAX_AGE", None)
    counter.start()

    def counted(label: str, loop: Callable[[], None]) -> float:
        from bench.lib.counting import connections_in_use

        before = {k: w.connection for k, w in connections_in_use().items()}
        found = counter.count(label, loop) / n
        after = {k: w.connection for k, w in connections_in_use().items()}
        if any(after.get(k) is not raw for k, raw in before.items()):
            raise RuntimeError(f"{label}: a connection was opened again inside the count")
        return found

    try:
        for name, (_, floor) in PATHS.items():
            with path_settings(name):
                run_all(paths.operations(name, ids.block(WARMUP)))()
                block = ids.block(n)
                if floor:
                    c.reset_tables()
                    captured = replay.capture(paths.operations(name, block))
                    c.reset_tables()
                    again = replay.replayer(captured)
                    paths.operations(name, block)  # the same prepared state
                    floor_instr = counted(f"{name} floor", again)
                    c.reset_tables()
                ops = paths.operations(name, block)
                instr = counted(name, run_all(ops))
            out[name] = {"instructions": round(instr)}
            if floor:
                out[name]["floor_instructions"] = round(floor_instr)
            c.log(f"{stack}: {name}: {out[name]}")
    finally:
        paths.close()
        c.close_django_connections()
    return out


# -- the process of one stack, and the orchestration ----------------------------------------

def one_stack(args: argparse.Namespace) -> int:
    from bench.lib import stacks

    queue = c.new_queue("bench-counts")
    c.configure_in_process(queue)
    with stacks.opened(args.one):
        if args.instructions_child:
            data: dict[str, Any] = {"instructions": instructions_stack(args.one, args.n)}
        else:
            data = count_stack(args.one, args.n)
            if not args.no_instructions:
                data["instructions"] = _under_callgrind(args)
    Path(args.out).write_text(json.dumps(data, indent=2) + "\n")
    return 0


def _under_callgrind(args: argparse.Namespace) -> dict[str, Any]:
    var = Path(os.environ.get("IDEM_VAR_DIR", "/tmp/idem-bench")) / "callgrind-counts"
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = handle.name
    try:
        status = callgrind.run_under(
            ["-m", "bench.suites.counts", "--one", args.one, "--instructions-child",
             "--n", str(args.instructions_n), "--out", out], var, instrument=False)
        if status:
            raise SystemExit(f"the instructions pass on {args.one} failed ({status})")
        return dict(json.loads(Path(out).read_text())["instructions"])
    finally:
        Path(out).unlink(missing_ok=True)


def combine(stack: dict[str, Any]) -> dict[str, Any]:
    """Each path's counts and instructions, and against its plain twin: the extra, the
    floor's share of it, the rest (the library's own Python), in µs at this machine's
    rate for the plain paths."""
    counts, instr = stack["counts"], stack.get("instructions") or {}
    rates = {}
    for name in SIDES.values():
        if name in instr and stack["cpu_us_plain"].get(name):
            rates[name] = instr[name]["instructions"] / stack["cpu_us_plain"][name]
    rows = {}
    for name in PATHS:
        row = dict(counts[name])
        if name in instr:
            row.update(instr[name])
            base = instr.get(BASELINE[name])
            if base and name != BASELINE[name]:
                extra = instr[name]["instructions"] - base["instructions"]
                row["extra_instructions"] = extra
                rate = rates.get(SIDES[PATHS[name][0]])
                if "floor_instructions" in instr[name]:
                    own = extra - instr[name]["floor_instructions"]
                    row["own_instructions"] = own
                    if rate:
                        row["own_us"] = round(own / rate, 1)
                if rate:
                    row["extra_us"] = round(extra / rate, 1)
        rows[name] = row
    return {"paths": rows, "instructions_per_us": {k: round(v) for k, v in rates.items()}}


def table(stack: str, data: dict[str, Any]) -> str:
    def cell(value: Any, width: int) -> str:
        if value is None:
            return f"{'-':>{width}}"
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        text = f"{value:,}" if isinstance(value, int) else str(value)
        return f"{text:>{width}}"

    head = (f"{stack:40}{'stmts':>6}{'(tx)':>5}{'trips':>6}{'commit':>7}{'flush':>6}"
            f"{'WAL B':>7}{'idx':>5}{'upd':>5}{'HOT':>5}{'instr/op':>11}{'extra':>10}"
            f"{'floor':>10}{'own':>10}{'own us':>8}")
    lines = [head, "-" * len(head)]
    for name, row in data["paths"].items():
        lines.append(
            f"{name:40}{cell(row.get('statements'), 6)}{cell(row.get('transaction_control'), 5)}"
            f"{cell(row.get('round_trips'), 6)}{cell(row.get('commits'), 7)}"
            f"{cell(row.get('flushes'), 6)}{cell(row.get('wal_bytes'), 7)}"
            f"{cell(row.get('index_entries'), 5)}{cell(row.get('updates'), 5)}"
            f"{cell(row.get('hot_updates'), 5)}{cell(row.get('instructions'), 11)}"
            f"{cell(row.get('extra_instructions'), 10)}{cell(row.get('floor_instructions'), 10)}"
            f"{cell(row.get('own_instructions'), 10)}{cell(row.get('own_us'), 8)}")
    rates = ", ".join(f"{k}: {v:,} instructions/µs" for k, v in
                      data["instructions_per_us"].items())
    if rates:
        lines.append(f"(µs at this run's rate for the plain paths: {rates})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stacks", default="postgres",
                    help=f"comma-separated, of {', '.join(STACKS)} (or all)")
    ap.add_argument("--n", type=int, default=20, help="operations counted per path")
    ap.add_argument("--instructions-n", type=int, default=30,
                    help="operations per path under callgrind")
    ap.add_argument("--no-instructions", action="store_true",
                    help="only the database counts (no callgrind pass)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--one", choices=STACKS, help=argparse.SUPPRESS)
    ap.add_argument("--instructions-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        return one_stack(args)
    chosen = list(STACKS) if args.stacks == "all" else args.stacks.split(",")
    unknown = set(chosen) - set(STACKS)
    if unknown:
        raise SystemExit(f"unknown stack(s) {sorted(unknown)}; choose from {STACKS}")
    from bench.lib.environment import environment

    results: dict[str, Any] = {}
    for stack in chosen:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
            out = handle.name
        try:
            command = [sys.executable, "-m", "bench.suites.counts", "--one", stack,
                       "--n", str(args.n), "--instructions-n", str(args.instructions_n),
                       "--out", out, *(["--no-instructions"] if args.no_instructions else [])]
            status = subprocess.run(command, cwd=c.ROOT).returncode
            if status:
                return status
            results[stack] = json.loads(Path(out).read_text())
        finally:
            Path(out).unlink(missing_ok=True)
        results[stack].update(combine(results[stack]))
    data = {"benchmark": "counts", "command": c.command_line(), "environment": environment(),
            "settings": {"n": args.n, "instructions_n": None if args.no_instructions
                         else args.instructions_n, "stacks": chosen},
            "stacks": results, "loadavg_end": c.loadavg()}
    c.write_result("counts", data, args.out)
    for stack in chosen:
        print("\n" + table(stack, results[stack]))
    return 0


if __name__ == "__main__":  # each stack's own process, and the one under callgrind
    sys.exit(main())
