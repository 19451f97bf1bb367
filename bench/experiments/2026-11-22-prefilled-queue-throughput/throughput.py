"""End-to-end throughput: N tasks through a real prefork worker, variant against variant.

    .venv/bin/python bench/throughput.py --n 5000 --rounds 3 --brokers redis,rabbitmq

What one run measures. The queue is filled first (the producer's own cost, e.g. the
PENDING intent or celery-once's lock, is timed separately as ``publish_s``), then a worker
starts (``-P prefork -c 2 --prefetch-multiplier 1``, ``acks_late`` from the project
settings, results ignored) and drains it. The worker's time is the span between the
first and the last task to finish, as stamped at ``task_postrun`` by the benchmark app
(one pipelined Redis call per task, the same for every variant; bench/worker_app.py), so
worker start-up is not counted; throughput is (messages - 1) / span. As a cross-check,
``db_msgs_per_s`` uses the first and last row the worker wrote (PostgreSQL timestamps).

Variants (``--variants``, comma-separated; ``:reuse`` or ``:hygienic`` after a name picks
the worker's connection policy, see bench/worker_app.py):

- ``plain``: a plain Celery task writing one row;
- ``once``: celery-once ``QueueOnce`` (distinct keys, Redis lock backend);
- ``idem``: ``IdempotentTask`` (claim, body, commit: three autocommit statements);
- ``atomic``: ``IdempotentTask(atomic=True)`` (the same in one transaction);
- ``replay3``: every message of the ``idem`` stream sent three times (N fresh runs then
  2N replays of finished keys); throughput counts all 3N messages;
- ``replay``: N messages for N keys that already succeeded (replay only).

Variants run interleaved in rounds (A B C ... A B C ...) on each broker, and every
variant's throughput is divided by the plain variant's of the same round.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.run_environment import environment  # noqa: E402
from bench.worker_process import WorkerProcess  # noqa: E402

from bench import _common as c  # noqa: E402
from bench import throughput_summary  # noqa: E402

VARIANTS = ("plain", "once", "idem", "atomic", "replay3", "replay")
DEFAULT_VARIANTS = "plain,once,idem,atomic,replay3,replay"


def parse_variant(spec: str) -> tuple[str, str]:
    """``name[:policy[+patch...]]``, e.g. ``idem``, ``idem:hygienic+prepared+rodup``."""
    name, _, conn = spec.partition(":")
    conn = conn or "fixup"
    if name not in VARIANTS:
        raise SystemExit(f"unknown variant {name!r}; choose from {VARIANTS}")
    policy, *patches = conn.split("+")
    if policy not in ("fixup", "reuse", "hygienic"):
        raise SystemExit(f"unknown connection policy {policy!r} in {spec!r}")
    from bench.worker_app import PATCHES

    for p in patches:
        if p not in PATCHES:
            raise SystemExit(f"unknown patch {p!r} in {spec!r}; choose from {sorted(PATCHES)}")
    return name, conn


def _task(name: str) -> Any:
    from django_app.effects import bench_tasks as t

    task = {"plain": t.bench_plain, "once": t.bench_once, "idem": t.bench_idem,
            "atomic": t.bench_atomic, "replay3": t.bench_idem, "replay": t.bench_idem}[name]
    if task is None:
        raise SystemExit("variant 'once' needs celery-once (pip install celery-once)")
    return task


def publish(name: str, n: int, queue: str, tag: str) -> tuple[int, float]:
    """Fill ``queue``; returns (messages, seconds spent publishing)."""
    from bench.worker_app import app

    task = _task(name)
    keys = [f"{tag}-{i}" for i in range(n)]
    stream = keys * 3 if name == "replay3" else keys
    started = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for key in stream:
            task.apply_async((key,), queue=queue, producer=producer)
    elapsed = time.perf_counter() - started
    if name == "replay":
        _finish_all()
    return len(stream), elapsed


def _finish_all() -> None:
    """Mark every job SUCCEEDED as a finished first run would (for the replay variant)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE celery_idem_job SET state = 'SUCCEEDED', attempt = 1, result = to_jsonb(key),"
            " started_at = now() - interval '1 hour', finished_at = now() - interval '1 hour',"
            " updated_at = now() - interval '1 hour' WHERE state = 'PENDING'")


def progress() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM effects_effect),"
            " (SELECT count(*) FROM celery_idem_job WHERE state = 'SUCCEEDED'),"
            " (SELECT count(*) FROM celery_idem_transition WHERE event = 'duplicate'),"
            " (SELECT count(*) FROM celery_idem_job WHERE state NOT IN ('SUCCEEDED', 'PENDING'))")
        effects, succeeded, duplicates, other = cursor.fetchone()
    return {"effects": effects, "succeeded": succeeded, "duplicates": duplicates,
            "other_states": other}


def done(name: str, n: int, p: dict[str, int]) -> bool:
    if name in ("plain", "once"):
        return p["effects"] >= n
    if name in ("idem", "atomic"):
        return p["succeeded"] >= n
    # A replay writes nothing (issue 11): the workers' marks, counted by the caller, are
    # what says every message was handled.
    if name == "replay3":
        return p["succeeded"] >= n
    return True  # replay


def worker_span(since: Any) -> tuple[float, float]:
    """(first, last) worker write after ``since``, as epoch seconds from PostgreSQL's clock."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM min(t)), extract(epoch FROM max(t)) FROM ("
            " SELECT created_at AS t FROM effects_effect"
            " UNION ALL SELECT at FROM celery_idem_transition WHERE event <> 'published'"
            " UNION ALL SELECT finished_at FROM celery_idem_job WHERE finished_at IS NOT NULL"
            ") s WHERE t >= %s", [since])
        first, last = cursor.fetchone()
    return float(first), float(last)


def db_now() -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def run_one(broker: str, name: str, conn: str, n: int, concurrency: int,
            timeout: float | None) -> dict[str, Any]:
    queue = c.new_queue(f"bench-{name}")
    tag = uuid.uuid4().hex[:8]
    c.reset_tables()
    if name == "once":
        c.clear_once_locks()
    load_before = c.loadavg()
    messages, publish_s = publish(name, n, queue, tag)
    sessions_before = c.sessions_opened()
    since = db_now()
    policy, *patches = conn.split("+")
    worker = WorkerProcess(queue, concurrency=concurrency, conn=policy,
                             extra_env={"BENCH_PATCH": ",".join(patches)})
    deadline = timeout or (90 + 0.05 * messages)
    try:
        with worker:
            silent = name == "replay" and "rodup" in patches  # writes nothing to wait for
            c.wait_for(lambda: c.marks(queue)["n"] >= messages
                       and (silent or done(name, n, progress())), deadline,
                       f"{name} on {broker} ({messages} messages)", alive=worker.alive,
                       on_fail=lambda: f"progress {progress()} {c.marks(queue)}\n"
                                       f"{worker.log()[-3000:]}")
            rss = worker.rss_kib()
    finally:
        c.delete_queue(broker, queue)
    m = c.marks(queue)
    c.clear_marks(queue)
    span = m["last"] - m["first"]
    try:
        first, last = worker_span(since)
        db_span = last - first
    except (TypeError, ValueError):
        db_span = None  # the variant wrote nothing (a replay without history lines)
    p = progress()
    sessions = c.sessions_opened() - sessions_before
    if name == "once":
        c.clear_once_locks()
    expected_effects = 0 if name == "replay" else n
    result = {
        "broker": broker, "variant": name, "conn": conn, "n": n, "messages": messages,
        "publish_s": round(publish_s, 4), "publish_us_per_msg": round(1e6 * publish_s / messages, 1),
        "span_s": round(span, 4),
        "msgs_per_s": round((messages - 1) / span, 1) if span > 0 else None,
        "us_per_msg": round(1e6 * span / max(1, messages - 1), 1),
        "db_span_s": round(db_span, 4) if db_span else None,
        "db_msgs_per_s": round(messages / db_span, 1) if db_span else None,
        "db_sessions_per_msg": round(sessions / messages, 3),
        "effects": p["effects"], "exactly_once": p["effects"] == expected_effects,
        "progress": p, "rss_kib": rss, "loadavg_before": load_before, "loadavg_after": c.loadavg(),
    }
    c.log(f"{broker:8} {name + ':' + conn:18} {messages:6} msgs  {result['msgs_per_s']:>8} msg/s"
          f"  publish {result['publish_us_per_msg']:>7} us/msg  sessions/msg "
          f"{result['db_sessions_per_msg']}  load {result['loadavg_after'][0]}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=5000, help="tasks per run (default 5000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--brokers", default="redis,rabbitmq")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--baseline", default="plain", help="variant the ratios divide by")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run")
    ap.add_argument("--out", default=None, help="results file (default bench/results/throughput.json)")
    args = ap.parse_args(argv)
    brokers = [b for b in args.brokers.split(",") if b]
    for b in brokers:
        if b not in c.BROKERS:
            raise SystemExit(f"unknown broker {b!r}")

    c.configure(brokers[0])
    c.setup_django()
    variants = [parse_variant(v) for v in args.variants.split(",") if v]
    env = environment()
    runs: list[dict[str, Any]] = []
    started = time.time()
    for broker in brokers:
        _switch_broker(broker)
        for rnd in range(args.rounds):
            for name, conn in variants:
                r = run_one(broker, name, conn, args.n, args.concurrency, args.timeout)
                r["round"] = rnd
                runs.append(r)
    baseline = args.baseline
    data = {
        "benchmark": "throughput", "command": c.command_line(), "environment": env,
        "settings": {"n": args.n, "rounds": args.rounds, "concurrency": args.concurrency,
                     "prefetch_multiplier": 1, "acks_late": True, "pool": "prefork",
                     "measure": "pre-filled queue; span from first to last worker write",
                     "baseline": baseline},
        "elapsed_s": round(time.time() - started, 1),
        "loadavg_end": c.loadavg(),
        "summary": throughput_summary.summarize(runs, baseline), "runs": runs,
    }
    c.write_result("throughput", data, args.out)
    throughput_summary.print_summary(data["summary"])
    bad = [r for r in runs if not r["exactly_once"] and r["variant"] != "plain"]
    if bad:
        c.log(f"exactly-once violated in {len(bad)} runs")
        return 1
    return 0


def _switch_broker(broker: str) -> None:
    """Point this (producer) process's Celery app at another broker."""
    from bench.worker_app import app

    url = c.BROKERS[broker]
    import os

    os.environ["IDEM_BROKER"] = url
    app.conf.broker_url = url
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None


if __name__ == "__main__":
    sys.exit(main())
