"""Publishing many keyed tasks as one batch, and one at a time, against plain Celery's group.

    python -m bench run publishing --n 1000 --rounds 5 [--stack pgbouncer]

Publishes N tasks per variant to Redis (no worker: publishing alone), on PostgreSQL
(``--database``: directly, behind a PgBouncer of its own, or MariaDB: bench/lib/stacks.py),
the variants interleaved in each round (so a busy moment of the machine hits them all):

- ``plain group``: ``group(plain_effect.s(k) ...).apply_async()``, a plain Django task
  (the baseline of every ratio);
- ``batch: publish_many(group)``: the same group of ``ship_order`` through
  ``celery_idem.publish_many``: one intent statement, then the messages;
- ``batch in atomic()``: a loop of ``delay`` in ``transaction.atomic()`` and
  ``celery_idem.batch()``: the intents in the transaction, the messages on commit;
- ``one at a time``: a loop of ``ship_order.delay`` (an intent statement each), for
  reference.

For each: the median seconds per batch over rounds, the rate ratio to the plain group
(plain's time / the variant's, per round, then the median: the variants of a round ran
back to back), the same ratio of the producer's CPU time, the load average, and the
intent statements per batch (Django's query
log on both connections, counted once after the timed rounds).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from bench.lib import common as c
from bench.lib.environment import environment
from bench.lib.stacks import STACKS, Stack, opened
from bench.suites import Options, refuse

QUESTION = ("How fast does publishing go, one at a time and as a batch, against plain "
            "Celery's group?")


def arguments(o: Options) -> list[str]:
    refuse("publishing", "--variants", o.variants)
    if o.broker not in (None, "redis"):
        raise SystemExit("suite 'publishing' publishes to Redis only")
    return ["--database", o.stack, *o.pick(o.n, 100, "--n"), *o.pick(o.rounds, 1, "--rounds")]


CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="tasks per batch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--database", default="postgres", choices=STACKS,
                        help="the stack (bench/lib/stacks.py; default PostgreSQL directly)")
    parser.add_argument("--out", default=None, help="results file")
    args = parser.parse_args(argv)

    queue = c.new_queue("bench-batch")
    c.configure("redis", queue)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: PgBouncer stopped
    with opened(args.database) as stack:
        measure(args, queue, stack)
    return 0


def measure(args: argparse.Namespace, queue: str, stack: Stack) -> None:
    c.setup_django()

    from celery import group
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from celery_idem import batch, publish_many
    from celery_idem.connection import bookkeeping_connection
    from django_app.effects.tasks import plain_effect, ship_order

    def plain(base: int) -> None:
        group(plain_effect.s(f"plain/{base + i}") for i in range(args.n)).apply_async()

    def batched(base: int) -> None:
        publish_many(group(ship_order.s(base + i) for i in range(args.n)))

    def in_atomic(base: int) -> None:
        with transaction.atomic(), batch():
            for i in range(args.n):
                ship_order.delay(base + i)

    def one_at_a_time(base: int) -> None:
        for i in range(args.n):
            ship_order.delay(base + i)

    variants: dict[str, Callable[[int], None]] = {
        "plain group": plain, "batch: publish_many(group)": batched,
        "batch in atomic()": in_atomic, "one at a time": one_at_a_time,
    }
    timings: dict[str, list[float]] = {name: [] for name in variants}
    cpu_times: dict[str, list[float]] = {name: [] for name in variants}
    loads: list[float] = []
    try:
        for name, publish in variants.items():  # warm up: connections, imports, plans
            publish(-10 * args.n * (1 + list(variants).index(name)))
        for round_ in range(args.rounds):
            c.reset_tables()
            c.delete_queue("redis", queue)
            for index, (name, publish) in enumerate(variants.items()):
                base = (round_ * len(variants) + index) * args.n
                started, cpu = time.perf_counter(), time.process_time()
                publish(base)
                timings[name].append(time.perf_counter() - started)
                cpu_times[name].append(time.process_time() - cpu)
            c.log(f"round {round_ + 1}", {n: round(t[-1], 3) for n, t in timings.items()})
            loads.append(c.loadavg()[0])
        # The bookkeeping connection is PostgreSQL's (celery_idem.connection); the
        # portable backend writes on Django's.
        bookkeeping = bookkeeping_connection("default") if stack.postgres else None
        statements = {name: _intent_statements(publish, 10**8 * (1 + i), connection,
                                               bookkeeping, CaptureQueriesContext)
                      for i, (name, publish) in enumerate(variants.items())}
    finally:
        c.delete_queue("redis", queue)
        c.reset_tables()
    plain_times = timings["plain group"]
    results: dict[str, Any] = {}
    for name, times in timings.items():
        # Per round (the variants of a round ran back to back), then the median and range.
        ratios = [plain / mine for plain, mine in zip(plain_times, times, strict=True)]
        results[name] = {
            "median_s_per_batch": round(c.median(times), 4),
            "s_per_batch_by_round": [round(t, 4) for t in times],
            "tasks_per_s": round(args.n / c.median(times)),
            "rate_ratio_to_plain_group": round(c.median(ratios), 3),
            "rate_ratio_by_round": [round(r, 3) for r in ratios],
            # The producer's own CPU (time.process_time), which other processes' load
            # disturbs less than the wall clock: plain's CPU / the variant's.
            "median_cpu_s_per_batch": round(c.median(cpu_times[name]), 4),
            "cpu_ratio_to_plain_group": round(c.median(
                p / m for p, m in zip(cpu_times["plain group"], cpu_times[name],
                                      strict=True)), 3),
            "intent_statements_per_batch": statements[name],
        }
        c.log(name, results[name])
    env = environment()
    env["stack"] = stack.describe()
    c.write_result("publish_batch" if stack.name == "postgres"
                   else f"publish_batch-{stack.name}", {
        "command": c.command_line(), "environment": env, "database": stack.name,
        "n": args.n, "rounds": args.rounds, "loadavg_1min_by_round": loads,
        "results": results,
    }, args.out)


def _intent_statements(publish: Callable[[int], None], base: int, connection: Any,
                       bookkeeping: Any, capture: Any) -> int:
    """Statements that write intents while ``publish(base)`` runs, on both connections
    (``bookkeeping`` None: there is none, MariaDB)."""
    from celery_idem.backends import routines

    with capture(connection) as django_log, \
            (capture(bookkeeping) if bookkeeping is not None else nullcontext()) as book_log:
        publish(base)
    queries = django_log.captured_queries + (book_log.captured_queries if book_log else [])
    # A call of a stored routine counts as the statement it runs.
    sqls = [routines.statement_of(q["sql"]) for q in queries]
    return sum("celery_idem_job" in sql and "INSERT" in sql.upper()
               for sql in sqls if not sql.lstrip().upper().startswith(CONTROL))

