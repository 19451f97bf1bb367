"""Memory: worker RSS after 10,000 tasks, plain Celery against IdempotentTask.

    .venv/bin/python -m bench run memory --n 10000

For each variant, the queue is filled with N messages, a prefork worker (2 children,
the throughput benchmark's settings) drains it, and the resident set size of the main
process and of each child is read from /proc: once the first 100 tasks are done (warm)
and once all N are (after). Growth between the two is what the plugin keeps per task,
if anything. Variants run interleaved in ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from bench.lib import common as c
from bench.lib.environment import environment
from bench.lib.workers import WorkerProcess
from bench.suites import Options

QUESTION = "How much memory does a worker hold after N tasks, against plain Celery?"
STACKS = ("postgres",)


def arguments(o: Options) -> list[str]:
    return [*(["--broker", o.broker] if o.broker else []),
            *(["--variants", o.variants] if o.variants else []),
            *o.pick(o.n, 200, "--n"), *o.pick(o.rounds, 1, "--rounds")]


VARIANTS = ("plain", "idem", "atomic")


def publish(name: str, n: int, queue: str, tag: str) -> float:
    """Fill ``queue`` with ``n`` messages of variant ``name``; the seconds it took."""
    from bench.lib import tasks as t
    from bench.lib.worker_app import app

    task = {"plain": t.bench_plain, "idem": t.bench_idem, "atomic": t.bench_atomic}[name]
    started = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for i in range(n):
            task.apply_async((f"{tag}-{i}",), queue=queue, producer=producer)
    return time.perf_counter() - started


def progress() -> dict[str, int]:
    """Effects written and jobs finished so far (PostgreSQL)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM effects_effect),"
            " (SELECT count(*) FROM celery_idem_job WHERE state = 'SUCCEEDED')")
        effects, succeeded = cursor.fetchone()
    return {"effects": effects, "succeeded": succeeded}


def done(name: str, n: int, p: dict[str, int]) -> bool:
    return p["effects" if name == "plain" else "succeeded"] >= n


def run(name: str, n: int, conn: str, broker: str) -> dict[str, Any]:
    queue = c.new_queue(f"bench-mem-{name}")
    c.reset_tables()
    publish(name, n, queue, uuid.uuid4().hex[:8])
    worker = WorkerProcess(queue, conn=conn)
    warm_at = min(100, n)
    try:
        with worker:
            c.wait_for(lambda: progress()["effects"] >= warm_at, 120, "warm-up",
                       interval=0.05, alive=worker.alive, on_fail=worker.log)
            warm = worker.rss_kib()
            c.wait_for(lambda: done(name, n, progress()), 90 + 0.05 * n,
                       f"{n} {name} tasks", alive=worker.alive,
                       on_fail=lambda: str(progress()) + worker.log()[-3000:])
            after = worker.rss_kib()
    finally:
        c.delete_queue(broker, queue)
        c.clear_marks(queue)
    growth = after["total"] - warm["total"]
    c.log(f"{name:8} warm {warm['total']} KiB  after {n}: {after['total']} KiB"
          f"  growth {growth} KiB  children {after['children']}")
    return {"variant": name, "conn": conn, "n": n, "warm_after_tasks": warm_at,
            "rss_warm_kib": warm, "rss_after_kib": after, "growth_kib": growth}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--variants", default="plain,idem")
    ap.add_argument("--conn", default="fixup", help="worker connection policy")
    ap.add_argument("--broker", default="redis")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    for name in args.variants.split(","):
        if name not in VARIANTS:
            raise SystemExit(f"unknown variant {name!r}; choose from {VARIANTS}")
    c.configure(args.broker)
    c.setup_django()
    import bench.lib.worker_app  # noqa: F401

    env = environment()
    runs = []
    for rnd in range(args.rounds):
        for name in args.variants.split(","):
            r = run(name, args.n, args.conn, args.broker)
            r["round"] = rnd
            runs.append(r)
    summary: dict[str, Any] = {}
    for name in args.variants.split(","):
        mine = [r for r in runs if r["variant"] == name]
        summary[name] = {
            "median_rss_after_total_kib": c.median(r["rss_after_kib"]["total"] for r in mine),
            "median_rss_after_child_kib": c.median(
                max(r["rss_after_kib"]["children"] or [0]) for r in mine),
            "median_growth_kib": c.median(r["growth_kib"] for r in mine),
        }
    base = summary.get("plain", {}).get("median_rss_after_total_kib")
    for name, s in summary.items():
        if base:
            s["extra_over_plain_kib"] = s["median_rss_after_total_kib"] - base
    data = {"benchmark": "memory", "command": c.command_line(), "environment": env,
            "settings": vars(args), "summary": summary, "runs": runs,
            "loadavg_end": c.loadavg()}
    c.write_result("memory", data, args.out)
    for name, s in summary.items():
        print(f"{name:8} RSS after {args.n}: {s['median_rss_after_total_kib']} KiB total,"
              f" largest child {s['median_rss_after_child_kib']} KiB,"
              f" growth {s['median_growth_kib']} KiB, over plain {s.get('extra_over_plain_kib')}")
    return 0

