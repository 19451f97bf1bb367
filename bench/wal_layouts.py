"""WAL per fresh task for candidate layouts of the job row (PostgreSQL 15+), in raw SQL.

    IDEM_PG_NAME=idem_bench .venv/bin/python bench/wal_layouts.py --n 500

Issue 21 item 2 asks for a narrow hot row: claim and commit rewriting only what changes.
Before building one, this measures what each layout would write. In scratch tables of a
schema of its own (``wal_layouts``, dropped first), it runs N fresh tasks' bookkeeping
as the library's statements do it (the intent an ``INSERT ... ON CONFLICT DO NOTHING``,
the claim and the commit conditional UPDATEs by id, each one statement) with the values
a real task writes (its envelope is read from the job table a ``bench/wal_breakdown.py``
run left, else a padded stand-in of the same size), and files the WAL records of each
statement as ``wal_breakdown`` does (pg_walinspect; FPI apart). The plain task's body
(``wal_breakdown``'s plain loop) runs in the same process for the ratio.

Layouts (``LAYOUTS``):

- ``current``: the job table as the migrations leave it (``LIKE celery_idem_job
  INCLUDING ALL``: every index, fillfactor 70);
- ``payload``: the write-once JSON (arguments, options, envelope) in a one-to-one side
  table written with the intent (one statement: a CTE), the row the claim and the commit
  update without it;
- ``split``: the identity and everything written once (key, task, arguments, envelope,
  created) with the indexes on them in one table, and what the claim and the commit move
  (state, attempt, worker, task id, lease, result, times) with the state indexes in a
  narrow one-to-one table;
- ``split_hot``: ``split`` with no index on the narrow table but its primary key, so the
  claim and the commit are HOT (the reaper and the admin would then scan it: not a
  shippable layout, the lower bound of the idea);
- ``lean``: ``current`` without ``celery_idem_job_created_idx`` (the admin ordering
  newest-first by id) and with the task id in a hash index (as migration 0012 has made
  it in ``current`` too);
- ``current_ff50``: ``current`` with fillfactor 50 instead of 70 (more room on each page
  for a row's next versions, 40 % more pages).
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

from bench import _common as c  # noqa: E402
from bench import wal_breakdown as wb  # noqa: E402
from bench.run_environment import environment  # noqa: E402

SCHEMA = "wal_layouts"
_IDENTITY = ("id bigserial PRIMARY KEY, namespace varchar(200) NOT NULL, key varchar(255)"
             " NOT NULL, task_name varchar(200) NOT NULL, fingerprint varchar(64) NOT NULL,"
             " created_at timestamptz NOT NULL, parent_id bigint, expires_at timestamptz")
_BLOBS = "args jsonb, kwargs jsonb, options jsonb NOT NULL, message jsonb"
_MOVING = ("state varchar(16) NOT NULL, attempt integer NOT NULL DEFAULT 0, worker"
           " varchar(255) NOT NULL DEFAULT '', task_id varchar(255) NOT NULL, lease_expires_at"
           " timestamptz, not_before timestamptz, dispatch_count integer NOT NULL DEFAULT 0,"
           " result jsonb, error jsonb, started_at timestamptz, finished_at timestamptz,"
           " updated_at timestamptz NOT NULL, sent_at timestamptz")
_IDENTITY_INDEXES = [
    "CREATE UNIQUE INDEX ON {t} (key, namespace)",
    "CREATE INDEX ON {t} (created_at DESC)",
    "CREATE INDEX ON {t} (task_name, created_at DESC)",
    "CREATE INDEX ON {t} (parent_id) WHERE parent_id IS NOT NULL",
]
_STATE_INDEXES = [
    "CREATE INDEX ON {t} (lease_expires_at) WHERE state = 'RUNNING'",
    "CREATE INDEX ON {t} (updated_at) WHERE state = 'PENDING'",
    "CREATE INDEX ON {t} (state, created_at DESC)"
    " WHERE state IN ('FAILED', 'UNCERTAIN', 'EXPIRED')",
    "CREATE INDEX ON {t} (state, task_name) WHERE state <> 'SUCCEEDED'",
    "CREATE INDEX ON {t} (task_id)",
]


def _one_table(drop: tuple[str, ...] = (), hash_task_id: bool = False,
               fillfactor: int = 70) -> list[str]:
    ddl = [f"CREATE TABLE {SCHEMA}.job (LIKE public.celery_idem_job INCLUDING ALL)"
           f" WITH (fillfactor = {fillfactor})"]
    ddl += [f"DROP INDEX {SCHEMA}.{name}" for name in drop]
    if hash_task_id:
        ddl += [f"DROP INDEX {SCHEMA}.job_task_id_idx",
                f"CREATE INDEX ON {SCHEMA}.job USING hash (task_id)"]
    return ddl


def _split(state_indexes: bool) -> list[str]:
    cold, hot = f"{SCHEMA}.job", f"{SCHEMA}.job_hot"
    ddl = [f"CREATE TABLE {cold} ({_IDENTITY}, {_BLOBS})",
           *(i.format(t=cold) for i in _IDENTITY_INDEXES),
           # task_name and created_at copied (written once) for the census and attention
           # indexes, which name the state.
           f"CREATE TABLE {hot} (job_id bigint PRIMARY KEY, task_name varchar(200) NOT NULL,"
           f" created_at timestamptz NOT NULL, {_MOVING}) WITH (fillfactor = 70)"]
    return ddl + ([i.format(t=hot) for i in _STATE_INDEXES] if state_indexes else [])


_COLS = ("namespace, key, task_name, fingerprint, created_at, args, kwargs, options, message,"
         " state, task_id, updated_at, sent_at")
_VALS = ("%(namespace)s, %(key)s, %(task_name)s, %(fingerprint)s, now(), %(args)s,"
         " %(kwargs)s, %(options)s, %(message)s, 'PENDING', %(task_id)s, now(), now()")
_CLAIM = ("SET state = 'RUNNING', attempt = attempt + 1, worker = %(worker)s, task_id ="
          " %(task_id)s, lease_expires_at = now() + interval '1 hour', not_before = NULL,"
          " started_at = now(), updated_at = now() WHERE {id} = %(id)s AND state = 'PENDING'")
_COMMIT = ("SET state = 'SUCCEEDED', updated_at = now(), finished_at = now(),"
           " lease_expires_at = NULL, result = %(result)s"
           " WHERE {id} = %(id)s AND state = 'RUNNING' AND attempt = 1")
_ONE_TABLE = {
    "intent": f"INSERT INTO {SCHEMA}.job ({_COLS}, attempt, worker, dispatch_count) VALUES"
              f" ({_VALS}, 0, '', 0) ON CONFLICT (namespace, key) DO NOTHING RETURNING id",
    "claim": f"UPDATE {SCHEMA}.job {_CLAIM.format(id='id')}",
    "commit": f"UPDATE {SCHEMA}.job {_COMMIT.format(id='id')}",
}
_PAYLOAD = {
    "intent": f"WITH ins AS (INSERT INTO {SCHEMA}.job (namespace, key, task_name, fingerprint,"
              " created_at, state, task_id, updated_at, sent_at, attempt, worker, dispatch_count)"
              " VALUES (%(namespace)s, %(key)s, %(task_name)s, %(fingerprint)s, now(),"
              " 'PENDING', %(task_id)s, now(), now(), 0, '', 0) ON CONFLICT (namespace, key) DO NOTHING RETURNING id), p AS (INSERT"
              f" INTO {SCHEMA}.job_payload SELECT id, %(args)s, %(kwargs)s, %(options)s,"
              " %(message)s FROM ins) SELECT id FROM ins",
    "claim": _ONE_TABLE["claim"], "commit": _ONE_TABLE["commit"],
}
_SPLIT = {
    "intent": f"WITH ins AS (INSERT INTO {SCHEMA}.job (namespace, key, task_name, fingerprint,"
              " created_at, args, kwargs, options, message) VALUES (%(namespace)s, %(key)s,"
              " %(task_name)s, %(fingerprint)s, now(), %(args)s, %(kwargs)s, %(options)s,"
              " %(message)s) ON CONFLICT (namespace, key) DO NOTHING RETURNING id,"
              f" task_name, created_at), h AS (INSERT INTO {SCHEMA}.job_hot (job_id,"
              " task_name, created_at, state, task_id, updated_at, sent_at) SELECT id,"
              " task_name, created_at, 'PENDING', %(task_id)s, now(), now() FROM ins)"
              " SELECT id FROM ins",
    "claim": f"UPDATE {SCHEMA}.job_hot {_CLAIM.format(id='job_id')}",
    "commit": f"UPDATE {SCHEMA}.job_hot {_COMMIT.format(id='job_id')}",
}
LAYOUTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "current": (_one_table(), _ONE_TABLE),
    "payload": (_one_table() + [
        f"ALTER TABLE {SCHEMA}.job DROP COLUMN args, DROP COLUMN kwargs, DROP COLUMN options,"
        " DROP COLUMN message",
        f"CREATE TABLE {SCHEMA}.job_payload (job_id bigint PRIMARY KEY, {_BLOBS})"], _PAYLOAD),
    "split": (_split(state_indexes=True), _SPLIT),
    "split_hot": (_split(state_indexes=False), _SPLIT),
    "lean": (_one_table(drop=("job_created_at_idx",), hash_task_id=True), _ONE_TABLE),
    "current_ff50": (_one_table(fillfactor=50), _ONE_TABLE),
}


def envelope() -> dict[str, Any]:
    """A real task's values: the envelope and arguments of a job ``wal_breakdown`` left."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT namespace, task_name, fingerprint, args::text, kwargs::text,"
                       " options::text, message::text FROM celery_idem_job"
                       " WHERE message IS NOT NULL ORDER BY id DESC LIMIT 1")
        row = cursor.fetchone()
    if row is None:  # no run before: a stand-in of the same shape and size
        row = ("bench.idem", "django_app.effects.bench_tasks.bench_idem", "f" * 64,
               '["k"]', "{}", '{"queue": "bench-wal"}',
               json.dumps({"pad": "x" * 700}))
    keys = ("namespace", "task_name", "fingerprint", "args", "kwargs", "options", "message")
    return dict(zip(keys, row, strict=True))


def run_layout(name: str, n: int, values: dict[str, Any], order: str) -> dict[str, Any]:
    """``order``: ``interleaved`` (each task's intent, claim and commit in turn: a worker
    keeping up), ``backlog`` (N intents, then N claims, then N commits: a queue drained
    later), ``held`` (``backlog`` while another session holds a snapshot, as a long
    report, a backup or a standby's feedback does: no dead row version can be pruned, so
    an update that finds no room on its page moves the whole row to another)."""
    from django.db import connection

    ddl, statements = LAYOUTS[name]
    with connection.cursor() as cursor:
        cursor.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        cursor.execute(f"CREATE SCHEMA {SCHEMA}")
        for sql in ddl:
            cursor.execute(sql)

    def loop(count: int, tag: str, marks: list[tuple[int, str]] | None) -> None:
        tasks = [{**values, "key": f"{tag}-{i}", "task_id": str(uuid.uuid4()),
                  "worker": "bench@local/1", "result": json.dumps(f"{tag}-{i}")}
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
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
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
        cursor.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
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
