"""WAL per fresh task, split by statement, relation and WAL record type (PostgreSQL 15+).

    python -m bench run wal --n 500

Runs, in this process on PostgreSQL, N plain tasks' writes (the benchmark task's one
``Effect`` INSERT through the ORM) and N fresh idempotent tasks through the real code
path a default-mode worker takes, one statement at a time so each one's WAL can be told
apart: the producer's intent (``bench_idem.apply_async``, with an in-memory broker: the
envelope is captured as for any broker), the claim (``claims.acquire`` on the worker's
bookkeeping connection), the body (the same ``Effect`` INSERT) and the commit
(``Claim.succeed``). Between statements it reads ``pg_current_wal_insert_lsn()``; at the
end it reads the records of the whole range with pg_walinspect
(``pg_get_wal_records_info``), keeps those of this database (a block of one of its
relations, or the commit record of a transaction that wrote one: the server is shared)
and files each record under the statement whose interval holds it.

Reported per task: bytes per statement, per relation (the job heap, each index, the
TOAST table) and per resource manager/record type, each as ``bytes`` (whole records)
and ``fpi`` (of which full-page images). A CHECKPOINT runs before each measured loop
(``--no-checkpoint`` to skip it), so full-page images are those of the first change to
each page after it: with a small N they are most of the bytes, hence reported apart;
``bytes - fpi`` is the steady-state figure.
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import uuid
from collections import defaultdict
from typing import Any

from bench.lib import common as c
from bench.lib.environment import environment
from bench.suites import Options, refuse

QUESTION = "How many WAL bytes does a fresh task write, by statement, relation and record?"
STACKS = ("postgres",)


def arguments(o: Options) -> list[str]:
    for option, value in (("--variants", o.variants), ("--broker", o.broker),
                          ("--rounds", o.rounds)):
        refuse("wal", option, value)
    return o.pick(o.n, 20, "--n")


QUEUE = "bench-wal"
STATEMENTS = ("intent", "claim", "body", "commit")
_REL = re.compile(r"rel \d+/(\d+)/(\d+)")


def insert_lsn() -> int:
    """The WAL insert position, as a byte offset (not a write: reading it logs nothing)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def checkpoint() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")


def records(start: int, end: int) -> list[dict[str, Any]]:
    """This database's WAL records in [start, end): those with a block of one of its
    relations, and the commit/abort records of the transactions that wrote them."""
    from django.db import DatabaseError, connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except DatabaseError as exc:  # PostgreSQL < 15, or not a superuser
        c.log(f"pg_walinspect unavailable, no records read: {exc}")
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
        oid = str(cursor.fetchone()[0])
        # pg_walinspect reads flushed WAL only; the bookkeeping connection's commits are
        # asynchronous (flushed within wal_writer_delay).
        cursor.execute("SELECT pg_lsn '0/0' + %s::numeric", [end])
        end_lsn = str(cursor.fetchone()[0])
        c.wait_for(lambda: _flushed(cursor, end_lsn), 10, "the WAL flush", interval=0.05)
        cursor.execute(
            "SELECT start_lsn - '0/0'::pg_lsn, xid::text, resource_manager, record_type,"
            " record_length, fpi_length, block_ref"
            " FROM pg_get_wal_records_info(pg_lsn '0/0' + %s::numeric, %s::pg_lsn)",
            [start, end_lsn])
        rows = cursor.fetchall()
        cursor.execute("SELECT relfilenode, relname FROM pg_class WHERE relfilenode <> 0")
        names = {str(f): n for f, n in cursor.fetchall()}
    ours: list[dict[str, Any]] = []
    xids = set()
    for lsn, xid, rmgr, rtype, length, fpi, blocks in rows:
        rels = [node for db, node in _REL.findall(blocks or "") if db == oid]
        if rels:
            xids.add(xid)
        ours.append({"lsn": int(lsn), "xid": xid, "rmgr": rmgr, "type": rtype,
                     "bytes": int(length), "fpi": int(fpi or 0),
                     "rel": _relation(names.get(rels[0], rels[0])) if rels else None})
    return [r for r in ours
            if r["rel"] is not None or (r["xid"] in xids and r["xid"] != "0")]


def _relation(name: str) -> str:
    # pg_toast_<oid> and pg_toast_<oid>_index: name them after the table.
    from celery_idem.models import Job

    match = re.fullmatch(r"pg_toast_(\d+)(_index)?", name)
    if match:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT relname FROM pg_class WHERE oid = %s", [int(match[1])])
            found = cursor.fetchone()
        table = found[0] if found else match[1]
        return f"{table} (toast{' index' if match[2] else ''})"
    return name if name != Job._meta.db_table else f"{name} (heap)"


def _flushed(cursor: Any, lsn: str) -> bool:
    cursor.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", [lsn])
    return bool(cursor.fetchone()[0])


def breakdown(marks: list[tuple[int, str]], end: int, n: int) -> dict[str, Any]:
    """Each record of the run filed under the statement whose interval holds it (marks:
    (lsn, statement) at each statement's start, in order), per task."""
    recs = records(marks[0][0], end)
    starts = [m[0] for m in marks]
    out: dict[str, dict[str, dict[str, float]]] = {
        "by_statement": defaultdict(lambda: {"bytes": 0, "fpi": 0}),
        "by_relation": defaultdict(lambda: {"bytes": 0, "fpi": 0}),
        "by_record": defaultdict(lambda: {"bytes": 0, "fpi": 0, "count": 0}),
        "by_statement_relation": defaultdict(lambda: {"bytes": 0, "fpi": 0}),
    }
    for r in recs:
        statement = marks[bisect.bisect_right(starts, r["lsn"]) - 1][1]
        rel = r["rel"] or "(commit records)"
        for group, name in (("by_statement", statement), ("by_relation", rel),
                            ("by_record", f"{r['rmgr']}/{r['type']}"),
                            ("by_statement_relation", f"{statement}: {rel}")):
            out[group][name]["bytes"] += r["bytes"]
            out[group][name]["fpi"] += r["fpi"]
            if group == "by_record":
                out[group][name]["count"] += 1
    total = sum(r["bytes"] for r in recs)
    fpi = sum(r["fpi"] for r in recs)
    return {
        "tasks": n, "records": len(recs),
        "bytes_per_task": round(total / n, 1), "fpi_per_task": round(fpi / n, 1),
        "bytes_without_fpi_per_task": round((total - fpi) / n, 1),
        **{group: {name: {k: round(v / n, 2) for k, v in d.items()}
                   for name, d in sorted(values.items(), key=lambda kv: -kv[1]["bytes"])}
           for group, values in out.items()},
    }


def run_plain(n: int, tag: str) -> dict[str, Any]:
    from django_app.effects.models import Effect

    marks = []
    for i in range(n):
        marks.append((insert_lsn(), "body"))
        Effect.objects.create(key=f"{tag}-{i}", pid=os.getpid())
    return breakdown(marks, insert_lsn(), n)


def run_idem(n: int, tag: str, pad: int = 0) -> dict[str, Any]:
    """The default mode's four statements, as a worker runs them (runner.py): the claim
    and the commit on the bookkeeping connection, the body on Django's."""
    from bench.lib import tasks as t
    from celery_idem import claims
    from django_app.effects.models import Effect

    marks = []
    for i in range(n):
        key = f"{tag}-{i}"
        marks.append((insert_lsn(), "intent"))
        # --pad: a header of that many random hex characters widens the envelope only.
        extra = {"headers": {"bench_pad": os.urandom(pad // 2).hex()}} if pad else {}
        t.bench_idem.apply_async((key,), queue=QUEUE, **extra)
        intent = t.bench_idem.intent((key,))
        marks.append((insert_lsn(), "claim"))
        _, claim = claims.acquire(intent, worker="bench@local/1", task_id=str(uuid.uuid4()),
                                  lease_seconds=3600, using="default", dedicated=True)
        assert claim is not None
        marks.append((insert_lsn(), "body"))
        Effect.objects.create(key=key, pid=os.getpid())
        marks.append((insert_lsn(), "commit"))
        assert claim.succeed(key)
    return breakdown(marks, insert_lsn(), n)


def measure(name: str, n: int, do_checkpoint: bool, pad: int = 0) -> dict[str, Any]:
    def run(count: int, tag: str) -> dict[str, Any]:
        return run_plain(count, tag) if name == "plain" else run_idem(count, tag, pad)

    run(5, f"warm-{uuid.uuid4().hex[:6]}")  # prepared statements, connections
    if do_checkpoint:
        checkpoint()
    result = run(n, uuid.uuid4().hex[:8])
    c.log(f"{name}: {result['bytes_per_task']} B/task ({result['fpi_per_task']} FPI)")
    return result


def job_row_width() -> dict[str, Any]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT avg(pg_column_size(j.*))::int, avg(pg_column_size(message))::int,"
            " avg(octet_length(message::text))::int FROM celery_idem_job j")
        row, message, message_text = cursor.fetchone()
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'celery_idem_job'")
        options = cursor.fetchone()[0]
        cursor.execute("SELECT attname, attstorage FROM pg_attribute WHERE attrelid ="
                       " 'celery_idem_job'::regclass AND attnum > 0 AND attstorage <> 'p'")
        storage = dict(cursor.fetchall())
    return {"row_bytes": row, "message_bytes_stored": message,
            "message_json_bytes": message_text, "reloptions": options, "attstorage": storage}


def show(data: dict[str, Any]) -> None:
    plain = data["plain"]
    for name in ("plain", "idem"):
        d = data[name]
        print(f"\n{name}: {d['bytes_per_task']} B/task, of which FPI {d['fpi_per_task']}"
              f" ({d['bytes_without_fpi_per_task']} without)")
        for group in ("by_statement", "by_relation", "by_record"):
            print(f"  {group}:")
            for k, v in d[group].items():
                extra = f" x{v['count']:.2f}" if "count" in v else ""
                print(f"    {k:58} {v['bytes']:9.1f} (fpi {v['fpi']:8.1f}){extra}")
    idem = data["idem"]
    print(f"\nidem / plain: {idem['bytes_per_task'] / plain['bytes_per_task']:.2f}x with FPI,"
          f" {idem['bytes_without_fpi_per_task'] / plain['bytes_without_fpi_per_task']:.2f}x"
          " without")
    print(f"job row: {data['job_row']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=500, help="tasks per variant")
    ap.add_argument("--no-checkpoint", action="store_true",
                    help="no CHECKPOINT before each measured loop")
    ap.add_argument("--pad", type=int, default=0,
                    help="widen each envelope by a header of this many bytes (random hex)")
    ap.add_argument("--out", default=None, help="results file")
    args = ap.parse_args(argv)

    c.configure_in_process(QUEUE)
    c.setup_django()
    import bench.lib.worker_app  # noqa: F401  (registers the benchmark tasks)

    c.reset_tables()
    env = environment()
    data = {"benchmark": "wal_breakdown", "command": c.command_line(), "environment": env,
            "settings": {"n": args.n, "checkpoint": not args.no_checkpoint, "pad": args.pad}}
    for name in ("plain", "idem"):
        data[name] = measure(name, args.n, not args.no_checkpoint, args.pad)
    data["job_row"] = job_row_width()
    c.write_result("wal_breakdown", data, args.out)
    show(data)
    return 0

