"""Protocol cost: statements and round trips per path, and microseconds per claim+commit.

    .venv/bin/python bench/protocol_cost.py --iterations 2000 --rounds 5

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
  the proposed changes prototyped in bench/worker_app.py (server-side prepared
  statements; no ``duplicate`` history line on a replay).

Part 1's paths are bench/protocol_paths.py, part 2's loops bench/protocol_loops.py, what
both run a task with bench/protocol_tracer.py and what part 1 counts with
bench/protocol_counter.py; this module runs them and prints the tables.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as c  # noqa: E402
from bench.protocol_loops import (  # noqa: E402
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
from bench.protocol_paths import paths  # noqa: E402
from bench.protocol_tracer import QUEUE, patched  # noqa: E402
from bench.run_environment import environment  # noqa: E402


def timings(iterations: int, rounds: int) -> dict[str, Any]:
    from django_app.effects import bench_tasks as t

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
    import bench.worker_app  # noqa: F401  (registers the benchmark tasks)

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


if __name__ == "__main__":
    sys.exit(main())
