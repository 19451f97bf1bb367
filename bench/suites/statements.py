"""Protocol cost: statements and round trips per path, and microseconds per claim+commit.

    python -m bench run statements --n 2000 --rounds 5    # --n: iterations per loop

Part 1 counts, on PostgreSQL, what each path of the protocol sends: SQL statements as
Django's ``CaptureQueriesContext`` sees them (BEGIN/COMMIT included) and network round
trips as libpq sees them (``ReadyForQuery`` messages in a libpq protocol trace). A path
runs through Celery's real task tracer (``celery.app.trace.build_tracer``, what a pool
child runs), in this process, with an in-memory broker so a published retry message
costs no network. Paths: publish (producer), fresh run (default and atomic), replay of
a finished key (default and atomic), in-progress duplicate, a retry (attempt 1 asks
for the retry, attempt 2 succeeds), and one recovery pass with 0 and 10 stale claims.

Part 2 times, in rounds, loops of ``--iterations`` operations on one persistent
connection, all autocommit:

- ``plugin claim+commit``: ``claims.acquire`` + ``Claim.succeed`` through Django's
  connection (what ``atomic=True`` and eager calls use); ``, dedicated connection``: on
  the worker's own bookkeeping connection (``celery_idem.connection``: server-side
  prepared statements, ``synchronous_commit=off``), what a default-mode task uses;
- ``raw same 2 statements``: the very SQL and parameters the plugin sent (captured),
  replayed with psycopg directly (``ClientCursor``, as Django uses): the driver floor;
- ``raw minimal claim+commit``: two bare UPDATEs without history rows;
- ``raw plain INSERT``: the plain task's only statement, for scale;
- ``reconnect + SELECT 1``: what the fixup's close at every task costs the next query;
- ``task plain|idem|atomic|replay``: a whole task through the tracer (no broker, no
  reconnect): what a worker process spends per task; ``prepared+rodup``: the same with
  the proposed changes prototyped in bench/lib/worker_app.py (server-side prepared
  statements; no ``duplicate`` history line on a replay).

Part 1's paths and what it counts are below; part 2's loops are statement_loops.py and
what both run a task with bench/lib/tracer.py.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.lib import common as c
from bench.lib.environment import environment
from bench.lib.tracer import QUEUE, patched, run_task
from bench.suites import Options, refuse
from bench.suites.statement_loops import (
    capture_statements,
    has_dedicated,
    locate_claim_columns,
    loop_plugin,
    loop_raw_insert,
    loop_raw_minimal,
    loop_raw_replay,
    loop_raw_same,
    loop_reconnect,
    loop_select1,
    loop_tasks,
    pending_intents,
    raw_connection,
)

QUESTION = ("Which statements and round trips does each path send, and what does a "
            "claim+commit cost against the same SQL through the driver?")
STACKS = ("postgres",)


def arguments(o: Options) -> list[str]:
    refuse("statements", "--variants", o.variants)
    refuse("statements", "--broker", o.broker)
    return [*o.pick(o.n, 50, "--iterations"), *o.pick(o.rounds, 1, "--rounds")]


def timings(iterations: int, rounds: int) -> dict[str, Any]:
    from bench.lib import tasks as t

    locate_claim_columns()
    samples: dict[str, list[float]] = {}
    conn = raw_connection()
    template = capture_statements(pending_intents(t.bench_idem, 1, uuid.uuid4().hex[:6])[0])
    try:
        for rnd in range(rounds):
            c.reset_tables()
            tag = uuid.uuid4().hex[:6]
            # one fresh set of PENDING rows per loop, published (not timed)
            sets = {name: pending_intents(t.bench_idem, iterations, f"{tag}{name}")
                    for name in ("plugin", "dedicated", "dedfix", "raw", "prepared",
                                 "minimal")}
            for name, task in (("idem", t.bench_idem), ("atomic", t.bench_atomic),
                               ("pidem", t.bench_idem), ("patomic", t.bench_atomic)):
                for i in range(iterations):
                    task.apply_async((f"{tag}t{name}-{i}",), queue=QUEUE)
            loops = [
                ("plugin claim+commit", lambda: loop_plugin(sets["plugin"])),
                ("plugin claim+commit, dedicated connection", lambda: loop_plugin(
                    sets["dedicated"], dedicated=has_dedicated())),
                ("plugin claim+commit, dedicated connection, dedfix", lambda: patched(
                    lambda: loop_plugin(sets["dedfix"], dedicated=has_dedicated()),
                    ("dedfix",))),
                ("raw same 2 statements", lambda: loop_raw_same(conn, template, sets["raw"])),
                ("raw same 2 statements, prepared", lambda: loop_raw_same(
                    conn, template, sets["prepared"], prepare=True)),
                ("raw replay, same statement", lambda: loop_raw_replay(
                    conn, template, sets["raw"], read_only=False)),
                ("raw replay, read only", lambda: loop_raw_replay(
                    conn, template, sets["raw"], read_only=True)),
                ("raw minimal claim+commit", lambda: loop_raw_minimal(conn, sets["minimal"])),
                ("raw plain INSERT", lambda: loop_raw_insert(conn, iterations, f"{tag}ins")),
                ("reconnect + SELECT 1 (Django)", lambda: loop_reconnect(iterations)),
                ("SELECT 1 (Django)", lambda: loop_select1(iterations)),
                ("task plain", lambda: loop_tasks(
                    t.bench_plain, [f"{tag}tp-{i}" for i in range(iterations)], None)),
                ("task idem", lambda: loop_tasks(
                    t.bench_idem, [f"{tag}tidem-{i}" for i in range(iterations)], "bench/")),
                ("task atomic", lambda: loop_tasks(
                    t.bench_atomic, [f"{tag}tatomic-{i}" for i in range(iterations)], "bench/")),
                ("task replay", lambda: loop_tasks(
                    t.bench_idem, [f"{tag}tidem-{i}" for i in range(iterations)], "bench/")),
                ("task idem, prepared+rodup+dedfix", lambda: patched(lambda: loop_tasks(
                    t.bench_idem, [f"{tag}tpidem-{i}" for i in range(iterations)], "bench/"))),
                ("task atomic, prepared", lambda: patched(lambda: loop_tasks(
                    t.bench_atomic, [f"{tag}tpatomic-{i}" for i in range(iterations)],
                    "bench/"))),
                ("task replay, prepared+rodup+dedfix", lambda: patched(lambda: loop_tasks(
                    t.bench_idem, [f"{tag}tpidem-{i}" for i in range(iterations)], "bench/"))),
            ]
            for name, fn in loops:
                samples.setdefault(name, []).append(1e6 * fn() / iterations)
            c.log(f"round {rnd + 1}/{rounds}: " + ", ".join(
                f"{k} {v[-1]:.0f}us" for k, v in samples.items()))
    finally:
        conn.close()
    med = {k: round(c.median(v), 1) for k, v in samples.items()}
    floor = med["raw same 2 statements"]
    return {
        "us_per_op": {k: [round(x, 1) for x in v] for k, v in samples.items()},
        "median_us": med,
        "plugin_over_floor": round(med["plugin claim+commit"] / floor, 3),
        "claim_commit_over_insert": round(floor / med["raw plain INSERT"], 3),
        "task_ratios_to_plain": {k: round(v / med["task plain"], 3)
                                 for k, v in med.items() if k.startswith("task ")},
        "captured_sql": [s for s, _ in template],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    c.configure_in_process(QUEUE)
    c.setup_django()
    import bench.lib.worker_app  # noqa: F401  (registers the benchmark tasks)

    c.reset_tables()
    env = environment()
    counted = paths()
    for name, d in counted.items():
        if "statements" in d:
            c.log(f"{name:48} {d['statements']:3} statements {d['round_trips']:3} round trips"
                  f"  {d.get('by_kind')}")
    timed = timings(args.iterations, args.rounds)
    data = {"benchmark": "protocol_cost", "command": c.command_line(), "environment": env,
            "settings": {"iterations": args.iterations, "rounds": args.rounds},
            "paths": counted, "timings": timed, "loadavg_end": c.loadavg()}
    c.write_result("protocol_cost", data, args.out)
    print(f"\n{'path':50} {'stmts':>5} {'trips':>5} {'protocol trips':>14}")
    for name, d in counted.items():
        if "statements" in d:
            print(f"{name:50} {d['statements']:5} {d['round_trips']:5}"
                  f" {d.get('protocol_round_trips', ''):>14}")
    print(f"\n{'loop':30} {'median us/op':>12}")
    for k, v in timed["median_us"].items():
        print(f"{k:30} {v:12}")
    print(f"plugin claim+commit / raw floor: {timed['plugin_over_floor']}")
    return 0



def paths() -> dict[str, Any]:
    from django.db import connection

    from bench.lib import tasks as t

    out: dict[str, Any] = {}
    tag = uuid.uuid4().hex[:6]

    def key_of(name: str) -> str:
        return f"{tag}-{name}"

    # plain task, for reference: one INSERT
    with count() as n:
        run_task(t.bench_plain, (key_of("plain"),))
    out["plain task (reference)"] = n.as_dict()

    # producer: the PENDING intent (outside a transaction on the bookkeeping connection,
    # whose first use of a statement prepares it: warm it first, as a producer's is)
    t.bench_idem.apply_async((key_of("warm"),), queue=QUEUE)
    with count() as n:
        t.bench_idem.apply_async((key_of("fresh"),), queue=QUEUE)
    out["publish (producer intent)"] = n.as_dict()

    ikey = "bench/" + key_of("fresh")
    with count() as n:
        run_task(t.bench_idem, (key_of("fresh"),), key=ikey)
    out["fresh run (default)"] = _beyond_body(n.as_dict())

    with count() as n:
        run_task(t.bench_idem, (key_of("fresh"),), key=ikey)
    out["replay of a finished key (default)"] = _beyond_body(n.as_dict(), body=0)

    t.bench_atomic.apply_async((key_of("atomic"),), queue=QUEUE)
    akey = "bench/" + key_of("atomic")
    with count() as n:
        run_task(t.bench_atomic, (key_of("atomic"),), key=akey)
    out["fresh run (atomic)"] = _beyond_body(n.as_dict())
    with count() as n:
        run_task(t.bench_atomic, (key_of("atomic"),), key=akey)
    out["replay of a finished key (atomic)"] = _beyond_body(n.as_dict(), body=0)

    # in-progress duplicate: another attempt holds a live claim
    t.bench_idem.apply_async((key_of("busy"),), queue=QUEUE)
    bkey = "bench/" + key_of("busy")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE celery_idem_job SET state = 'RUNNING', attempt = 1, worker = 'other/1',"
            " task_id = 'other', lease_expires_at = now() + interval '1 hour'"
            " WHERE namespace = %s AND key = %s", [t.bench_idem.name, bkey])
    with count() as n:
        run_task(t.bench_idem, (key_of("busy"),), key=bkey)
    out["in-progress duplicate (on_in_progress=retry)"] = _beyond_body(n.as_dict(), body=0)

    # retry: attempt 1 asks for a retry, attempt 2 succeeds (same task id, as Celery does)
    t.bench_retry.apply_async((key_of("retry"),), queue=QUEUE)
    rkey = "bench-retry/" + key_of("retry")
    tid = str(uuid.uuid4())
    with count() as n:
        run_task(t.bench_retry, (key_of("retry"),), key=rkey, task_id=tid)
    out["retry: attempt 1 (self.retry)"] = _beyond_body(n.as_dict())
    with count() as n:
        run_task(t.bench_retry, (key_of("retry"),), key=rkey, task_id=tid, retries=1)
    out["retry: attempt 2 (succeeds)"] = _beyond_body(n.as_dict())

    # the same default-mode paths with the proposed fixes (bench/lib/worker_app.py PATCHES)
    def fixed_paths() -> None:
        t.bench_idem.apply_async((key_of("fixed"),), queue=QUEUE)
        fkey = "bench/" + key_of("fixed")
        for _ in range(6):  # warm: the connection opens and prepares its statements
            t.bench_idem.apply_async((key_of("warm") + str(_),), queue=QUEUE)
            run_task(t.bench_idem, (key_of("warm") + str(_),), key="bench/" + key_of("warm") + str(_))
        with count() as n:
            run_task(t.bench_idem, (key_of("fixed"),), key=fkey)
        out["fresh run (default), proposed fixes"] = _beyond_body(n.as_dict())
        with count() as n:
            run_task(t.bench_idem, (key_of("fixed"),), key=fkey)
        out["replay of a finished key (default), proposed fixes"] = _beyond_body(
            n.as_dict(), body=0)
        return 0.0

    patched(fixed_paths)
    out.update(reaper_paths(tag))
    return out


def _beyond_body(d: dict[str, Any], body: int = 1) -> dict[str, Any]:
    """The body writes one row (one statement, one round trip) in these tasks."""
    d["body_statements"] = body
    d["protocol_statements"] = d["statements"] - body
    d["protocol_round_trips"] = d["round_trips"] - body
    return d


def reaper_paths(tag: str) -> dict[str, Any]:
    try:
        from celery_idem.recovery import reap
    except ImportError as exc:
        return {"recovery pass": {"pending": f"celery_idem.recovery not importable: {exc}"}}
    from django.db import connection

    from bench.lib import tasks as t

    out: dict[str, Any] = {}
    now = datetime.now(UTC)
    with count() as n:
        reap(now=now)
    out["recovery pass, nothing to do"] = n.as_dict()
    for i in range(10):
        t.bench_idem.apply_async((f"{tag}-stale-{i}",), queue=QUEUE)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE celery_idem_job SET state = 'RUNNING', attempt = 1, worker = 'dead/1',"
            " lease_expires_at = now() - interval '1 minute', updated_at = now()"
            " WHERE key LIKE %s", [f"bench/{tag}-stale-%"])
    with count() as n:
        report = reap(now=datetime.now(UTC))
    d = n.as_dict()
    d["report"] = str(report)
    d["per_stale_claim_statements"] = round((d["statements"] - out[
        "recovery pass, nothing to do"]["statements"]) / 10, 2)
    out["recovery pass, 10 stale claims"] = d
    return out


class Counter:
    """Statements (Django's query log) and round trips (libpq trace) within a block."""

    def __init__(self) -> None:
        self.statements: list[str] = []
        self.round_trips = 0
        self.elapsed_us = 0.0
        self.per_connection: dict[str, dict[str, int]] = {}

    def as_dict(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for sql in self.statements:
            kinds[_kind(sql)] = kinds.get(_kind(sql), 0) + 1
        return {"statements": len(self.statements), "round_trips": self.round_trips,
                "per_connection": self.per_connection,
                "by_kind": kinds, "elapsed_us": round(self.elapsed_us, 1),
                "sql": [s[:160] for s in self.statements]}


def _kind(sql: str) -> str:
    s = sql.lstrip().upper()
    if s.startswith("WITH"):
        # a data-modifying CTE: name it by its first write
        for word in ("INSERT", "UPDATE", "DELETE"):
            if word in s:
                return f"WITH..{word}"
        return "WITH..SELECT"
    return s.split(None, 1)[0] if s else "?"


def _connections() -> list[tuple[str, Any]]:
    """Django's connection, and the plugin's dedicated bookkeeping connection if it has
    one (celery_idem.connection: default-mode claims and commits in a worker)."""
    from django.db import connection

    found = [("django", connection)]
    try:
        from celery_idem.connection import bookkeeping_connection
    except ImportError:
        return found
    found.append(("dedicated", bookkeeping_connection("default")))
    return found


@contextmanager
def count() -> Any:
    """Statements and round trips on every connection the plugin may use."""
    from django.test.utils import CaptureQueriesContext

    result = Counter()
    with ExitStack() as stack:
        captures, traces = [], []
        for label, conn in _connections():
            capture = stack.enter_context(CaptureQueriesContext(conn))
            captures.append((label, capture))
            pgconn = conn.connection.pgconn
            fd, path = tempfile.mkstemp(prefix="libpq-trace-")
            pgconn.trace(fd)
            traces.append((label, pgconn, fd, path))
        started = time.perf_counter()
        try:
            yield result
        finally:
            result.elapsed_us = 1e6 * (time.perf_counter() - started)
            texts = {}
            for label, pgconn, fd, path in traces:
                pgconn.untrace()
                os.close(fd)
                texts[label] = Path(path).read_text(errors="replace")
                os.unlink(path)
    result.statements = [q["sql"] for _, cap in captures for q in cap.captured_queries]
    result.per_connection = {
        label: {"statements": len(cap.captured_queries),
                "round_trips": sum(1 for line in texts[label].splitlines()
                                   if "ReadyForQuery" in line)}
        for label, cap in captures}
    result.round_trips = sum(v["round_trips"] for v in result.per_connection.values())
