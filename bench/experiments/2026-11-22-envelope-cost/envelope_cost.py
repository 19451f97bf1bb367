"""What keeping the message costs (issue 13): bytes per job row and publish latency.

    .venv/bin/python bench/envelope_cost.py --n 2000 --rounds 3

Publishes ``ship_order(n)`` N times per variant into an in-memory broker (so the broker
costs nothing and the difference is the producer's), on PostgreSQL:

- ``before (no envelope)``: the row as it was before the envelope (``envelope.capture``
  stubbed out: no ``message`` column value), same code path otherwise;
- ``envelope``: the row with its envelope;
- ``envelope + link/errback``: a message carrying two callbacks in its body;
- ``outbox (atomic, 1 per txn)``: inside ``transaction.atomic()``: the intent in the
  transaction, the message on commit, then the ``sent`` mark (2 statements).

For each: the median microseconds per publish over rounds, the statements per publish
(Django's query log, transaction control excluded), and the average size of a job row
(``pg_column_size`` of the row and of ``message``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.run_environment import environment  # noqa: E402

from bench import _common as c  # noqa: E402

CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="publishes per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    c.configure_in_process(c.new_queue("bench-envelope"))
    c.setup_django()

    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from celery_idem import envelope
    from celery_idem.connection import bookkeeping_connection
    from celery_idem.models import Job
    from django_app.effects.tasks import notify, ship_order

    real_capture = envelope.capture

    def plain(n: int) -> None:
        ship_order.delay(n)

    def linked(n: int) -> None:
        ship_order.apply_async((n,), link=notify.si(n, "shipped"),
                               link_error=notify.si(n, "failed"))

    def outbox(n: int) -> None:
        with transaction.atomic():
            ship_order.delay(n)

    variants: dict[str, tuple[Callable[[int], None], bool]] = {
        "before (no envelope)": (plain, False),
        "envelope": (plain, True),
        "envelope + link/errback": (linked, True),
        "outbox (atomic, 1 per txn)": (outbox, True),
    }
    results: dict[str, Any] = {}
    for name, (publish, kept) in variants.items():
        envelope.capture = real_capture if kept else (lambda *_: None)  # type: ignore[assignment]
        timings = []
        for i in range(20):  # warm up: connections, prepared plans, imports
            publish(-1 - i)
        for round_ in range(args.rounds):
            c.reset_tables()
            base = round_ * args.n
            started = time.perf_counter()
            for i in range(args.n):
                publish(base + i)
            timings.append((time.perf_counter() - started) / args.n * 1e6)
        # Django's connection and the bookkeeping one (the intent outside a transaction).
        bookkeeping = bookkeeping_connection("default")
        with CaptureQueriesContext(connection) as captured, \
                CaptureQueriesContext(bookkeeping) as captured_bookkeeping:
            publish(10**9)
        statements = [q["sql"] for q in (captured.captured_queries
                                         + captured_bookkeeping.captured_queries)
                      if not q["sql"].lstrip().upper().startswith(CONTROL)]
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT avg(pg_column_size(j.*)), "
                           f"avg(COALESCE(pg_column_size(j.message), 0)) "
                           f"FROM {Job._meta.db_table} j")
            row_bytes, message_bytes = cursor.fetchone()
        results[name] = {
            "median_us_per_publish": round(c.median(timings), 1),
            "us_per_publish_by_round": [round(t, 1) for t in timings],
            "statements_per_publish": len(statements),
            "avg_row_bytes": round(float(row_bytes), 1),
            "avg_message_bytes": round(float(message_bytes), 1),
        }
        c.log(name, results[name])
    envelope.capture = real_capture  # type: ignore[assignment]
    c.reset_tables()
    c.write_result("envelope_cost", {
        "command": c.command_line(), "environment": environment(),
        "n": args.n, "rounds": args.rounds, "results": results,
    }, args.out)


if __name__ == "__main__":
    main()
