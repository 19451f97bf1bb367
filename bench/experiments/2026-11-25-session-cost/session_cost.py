"""What prepared statements and the unflushed bookkeeping commits are worth, on a direct
PostgreSQL connection (issue 18: both are session-free by default now, or opt-in).

    .venv/bin/python bench/session_cost.py --n 500 --rounds 5

In this process, one client, through the library's real code paths, N keys per loop:

- ``plain`` (a default-mode task's database work): the intent outside a transaction
  (``producer.write_intent``, on the bookkeeping connection, its commit flushed), the
  claim as a worker makes it (``claims.acquire(dedicated=True)``) and its commit
  (``Claim.succeed``), both on the bookkeeping connection;
- ``atomic`` (an atomic task's): the intent, then in ``transaction.atomic()`` on Django's
  connection the claim, the body's one ORM INSERT and the commit move pipelined with
  COMMIT (``Claim.succeed(ends_transaction=True)``).

Each loop under each variant, interleaved per round (every session reopened at a
variant's start, so it runs under its settings):

- ``default``: the library's defaults (nothing prepared; claims and commits unflushed,
  per transaction);
- ``prepared``: ``CELERY_IDEM_PREPARED_STATEMENTS = True``;
- ``flushed``: ``CELERY_IDEM_SYNCHRONOUS_COMMIT = True`` (every commit waits for the WAL
  flush: what dropping the unflushed commits would cost);
- ``prepared+flushed``;
- ``no-routines``: the defaults, with the statements sent themselves instead of calls of
  the stored routines (backends/routines.py), as on a database before migration 0014.

Per loop: keys per second (wall), this process's CPU µs per key and the server's (every
PostgreSQL backend connected to the benchmark database, from /proc). Ratios are per round
against ``default`` of the same round and loop; medians and the lowest and highest round.
One client in sequence: each flush is waited for in full (no group commit with other
sessions), which is a worker child's view of it. ``IDEM_PG_NAME`` (default
``idem_bench``); run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpu_groups import CLK, ticks  # noqa: E402
from bench.run_environment import environment  # noqa: E402
from bench.stacks import Stack  # noqa: E402

from bench import _common as c  # noqa: E402

_STACK = Stack("postgres")

VARIANTS = {
    "default": {"PREPARED_STATEMENTS": False, "SYNCHRONOUS_COMMIT": False},
    # The statements sent themselves, as before migration 0014 installed the routines.
    "no-routines": {"PREPARED_STATEMENTS": False, "SYNCHRONOUS_COMMIT": False},
    "prepared": {"PREPARED_STATEMENTS": True, "SYNCHRONOUS_COMMIT": False},
    "flushed": {"PREPARED_STATEMENTS": False, "SYNCHRONOUS_COMMIT": True},
    "prepared+flushed": {"PREPARED_STATEMENTS": True, "SYNCHRONOUS_COMMIT": True},
}
LOOPS = ("plain", "atomic")
WARMUP = 20


def apply(variant: str) -> None:
    """The variant's settings, on sessions opened under them."""
    from django.conf import settings
    from django.core.signals import setting_changed
    from django.db import connections

    from celery_idem import connection as bookkeeping
    from celery_idem.backends import routines

    library_calls = _library_calls()  # before any variant replaces it
    routines.forget()
    routines.calls = (_no_routines if variant == "no-routines"  # type: ignore[assignment]
                      else library_calls)
    for name, value in VARIANTS[variant].items():
        setattr(settings, f"CELERY_IDEM_{name}", value)
        setting_changed.send(sender=None, setting=f"CELERY_IDEM_{name}", value=value,
                             enter=True)
    connections.close_all()
    bookkeeping.close_bookkeeping_connections()


@cache
def _library_calls() -> Any:
    """The library's ``routines.calls``, kept from the first variant on."""
    from celery_idem.backends import routines

    return routines.calls


def _no_routines(connection: Any) -> dict[str, str]:
    return {}


def one_plain(n: int, prefix: str) -> None:
    from celery_idem import claims, connection
    from celery_idem.producer import write_intent
    from django_app.effects.tasks import ship_order

    intent = replace(ship_order.intent((n,), {}), key=f"{prefix}-{n}")
    write_intent(intent, f"pub-{prefix}-{n}")
    _, claim = claims.acquire(intent, worker="bench/1", task_id=f"t-{prefix}-{n}",
                              lease_seconds=60, using="default", dedicated=True)
    assert claim is not None and claim.succeed(n)
    connection.release_bookkeeping()  # as task_postrun does


def one_atomic(n: int, prefix: str) -> None:
    from django.db import transaction

    from celery_idem import claims
    from celery_idem.producer import write_intent
    from django_app.effects.models import Effect
    from django_app.effects.tasks import deduct_stock

    intent = replace(deduct_stock.intent((n, 1, 1), {}), key=f"{prefix}-{n}")
    write_intent(intent, f"pub-{prefix}-{n}")
    with transaction.atomic():
        _, claim = claims.acquire(intent, worker="bench/1", task_id=f"t-{prefix}-{n}",
                                  lease_seconds=60, using="default")
        assert claim is not None
        Effect.objects.create(key=f"{prefix}-{n}", pid=os.getpid())
        assert claim.succeed(n, ends_transaction=True)


def loop(kind: str, n: int) -> dict[str, float]:
    one = one_plain if kind == "plain" else one_atomic
    prefix = f"{kind}-{uuid.uuid4().hex[:8]}"
    for i in range(WARMUP):  # sessions opened, statements prepared where asked
        one(i, f"warm-{prefix}")
    # The server's CPU: every backend of the benchmark database (the two this process
    # uses, and the direct connection asking), as honest.py reads it.
    backends = _STACK.server_groups()["postgres"]
    server = sum(ticks(p) for p in backends)
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(n):
        one(i, prefix)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    server = sum(ticks(p) for p in backends) - server
    return {"per_s": n / wall, "cpu_us": cpu / n * 1e6,
            "server_cpu_us": server / CLK / n * 1e6}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=500, help="keys per loop")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    if "default" not in variants:
        parser.error("the variants must include default (the ratios' baseline)")
    c.configure_in_process(c.new_queue("bench-session"))
    c.setup_django()
    load = [c.loadavg()]
    rounds: list[dict[str, dict[str, dict[str, float]]]] = []
    for r in range(args.rounds):
        c.reset_tables()
        result: dict[str, dict[str, dict[str, float]]] = {}
        for variant in variants:
            apply(variant)
            result[variant] = {kind: loop(kind, args.n) for kind in LOOPS}
            c.log(f"round {r + 1} {variant}: " + ", ".join(
                f"{k} {v['per_s']:.0f}/s" for k, v in result[variant].items()))
        rounds.append(result)
    apply("default")
    load.append(c.loadavg())
    summary: dict[str, Any] = {}
    for variant in variants:
        summary[variant] = {}
        for kind in LOOPS:
            ratios = [rd[variant][kind]["per_s"] / rd["default"][kind]["per_s"] for rd in rounds]
            summary[variant][kind] = {
                "per_s": c.median(rd[variant][kind]["per_s"] for rd in rounds),
                "ratio_to_default": c.median(ratios), "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "cpu_us": c.median(rd[variant][kind]["cpu_us"] for rd in rounds),
                "server_cpu_us": c.median(rd[variant][kind]["server_cpu_us"] for rd in rounds),
            }
    for variant, kinds in summary.items():
        print(variant, {k: {m: round(v, 3) for m, v in s.items()} for k, s in kinds.items()})
    c.write_result("session_cost", {
        "command": c.command_line(), "environment": environment(), "n": args.n,
        "rounds": rounds, "summary": summary, "loadavg_before_after": load,
    }, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
