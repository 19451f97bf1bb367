"""WAL per fresh task for candidate layouts of the job row (PostgreSQL 15+), in raw SQL.

    IDEM_PG_NAME=idem_bench .venv/bin/python bench/wal_layouts.py --n 500

Issue 21 item 2 asks for a narrow hot row: claim and commit rewriting only what changes.
Before building one, this measures what each layout would write. In scratch tables of a
schema of its own (``bench_layouts``, dropped first), it runs N fresh tasks' bookkeeping
as the library's statements do it (the intent an ``INSERT ... ON CONFLICT DO NOTHING``,
the claim and the commit conditional UPDATEs by id, each one statement) with the values
a real task writes (its envelope is read from the job table a ``bench/wal_breakdown.py``
run left, else ``layouts_sql.library_values``: the lean stored message the library keeps
of the benchmark task), and files the WAL records of each statement as ``wal_breakdown``
does (pg_walinspect; FPI apart). The plain task's body (``wal_breakdown``'s plain loop)
runs in the same process for the ratio.

Layouts: ``bench/layouts_sql.py`` (``current``, ``bare``, ``payload``, ``split``,
``split_hot``, ``lean``, ``current_ff50``), each alone in its schema (dropped first and at
the end).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.run_environment import environment  # noqa: E402

from bench import _common as c  # noqa: E402
from bench import layouts_sql  # noqa: E402
from bench import wal_breakdown as wb  # noqa: E402


def envelope() -> dict[str, Any]:
    """A real task's values: the envelope and arguments of a job ``wal_breakdown`` left."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT namespace, task_name, fingerprint, args::text, kwargs::text,"
                       " options::text, message::text FROM celery_idem_job"
                       " WHERE message IS NOT NULL ORDER BY id DESC LIMIT 1")
        row = cursor.fetchone()
    if row is None:  # no run before: what the library stores of the benchmark task
        return layouts_sql.library_values("bench.idem", "k", "bench-wal")
    keys = ("namespace", "task_name", "fingerprint", "args", "kwargs", "options", "message")
    return dict(zip(keys, row, strict=True))


def run_layout(name: str, n: int, values: dict[str, Any], order: str) -> dict[str, Any]:
    """``order``: ``interleaved`` (each task's intent, claim and commit in turn: a worker
    keeping up), ``backlog`` (N intents, then N claims, then N commits: a queue drained
    later), ``held`` (``backlog`` while another session holds a snapshot, as a long
    report, a backup or a standby's feedback does: no dead row version can be pruned, so
    an update that finds no room on its page moves the whole row to another)."""
    from django.db import connection

    layout = layouts_sql.LAYOUTS[name]
    statements = {"intent": layout.intent, "claim": layout.claim_by_id,
                  "commit": layout.commit}
    with connection.cursor() as cursor:
        layouts_sql.create(cursor, name)

    def loop(count: int, tag: str, marks: list[tuple[int, str]] | None) -> None:
        tasks = [{**values, "key": f"{tag}-{i}", "task_id": str(uuid.uuid4()),
                  "worker": "bench@local/1", "result": json.dumps(f"{tag}-{i}"), "attempt": 1}
                 for i in range(count)]
        steps = [(p, s) for p in tasks for s in ("intent", "claim", "commit")]
        if order != "interleaved":
            steps = [(p, s) for s in ("intent", "claim", "commit") for p in tasks]
        with connection.cursor() as cursor:
            for params, statement in steps:
                if marks is not None:
                    marks.append((wb.insert_lsn(), statement))
                cursor.execute(statements[statement], params)
                if statement == "intent":
                    params["id"] = cursor.fetchone()[0]

    loop(5, "warm", None)
    wb.checkpoint()
    marks: list[tuple[int, str]] = []
    with _snapshot_held(order == "held"):
        loop(n, uuid.uuid4().hex[:8], marks)
    result = wb.breakdown(marks, wb.insert_lsn(), n)
    c.log(f"{name} ({order}): {result['bytes_without_fpi_per_task']} B/task without FPI")
    return result


@contextlib.contextmanager
def _snapshot_held(hold: bool) -> Iterator[None]:
    """Another session's open REPEATABLE READ transaction, which has taken its snapshot
    (and an xid, so the horizon stays put)."""
    if not hold:
        yield
        return
    import psycopg
    from django.db import connection

    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}) as other:
        other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT txid_current()")
        try:
            yield
        finally:
            other.rollback()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=500, help="tasks per layout")
    ap.add_argument("--layouts", default=",".join(layouts_sql.LAYOUTS))
    ap.add_argument("--orders", default="interleaved,backlog,held",
                    help="interleaved, backlog, held (see run_layout)")
    ap.add_argument("--out", default=None, help="default bench/results/wal_layouts.json")
    args = ap.parse_args(argv)

    c.configure_in_process(wb.QUEUE)
    c.setup_django()
    import bench.worker_app  # noqa: F401  (registers the benchmark tasks)

    values = envelope()
    data: dict[str, Any] = {
        "benchmark": "wal_layouts", "command": c.command_line(),
        "environment": environment(), "settings": {"n": args.n},
        "message_json_bytes": len(values["message"]),
        "plain": wb.measure("plain", args.n, True), "layouts": {}}
    plain = data["plain"]["bytes_without_fpi_per_task"]
    for order in args.orders.split(","):
        for name in args.layouts.split(","):
            result = run_layout(name, args.n, values, order)
            task = result["bytes_without_fpi_per_task"] + plain  # + the body, as plain's
            result["fresh_task_without_fpi"] = round(task, 1)
            result["ratio_to_plain"] = round(task / plain, 2)
            data["layouts"][f"{name}/{order}"] = result
    from django.db import connection

    with connection.cursor() as cursor:
        layouts_sql.drop(cursor)
    c.write_result("wal_layouts", data, args.out)
    print(f"plain task: {plain} B (without FPI)")
    for name, r in data["layouts"].items():
        per = {s: v["bytes"] - v["fpi"] for s, v in r["by_statement"].items()}
        print(f"{name:22} bookkeeping {r['bytes_without_fpi_per_task']:7.1f} B"
              f"  fresh task {r['fresh_task_without_fpi']:7.1f} B = {r['ratio_to_plain']:5.2f}x"
              f"  ({', '.join(f'{s} {b:.0f}' for s, b in per.items())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
