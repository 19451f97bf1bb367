"""Candidate layouts of the job row in raw SQL, PostgreSQL 15+ (and the
least table and today's on MySQL/MariaDB, ``MYSQL_LAYOUTS``): each layout's tables and the
intent, claim and commit the library would run on them.

Plain strings, like bench/lib/floor_sql.py. Two users:

- bench/experiments/2026-11-27-job-row-layouts/wal_layouts.py: WAL per statement, the
  claim and the commit by the id the intent returned;
- the end-to-end suite's layout floors (``floor-bare``, ``floor-bare-broker``,
  ``floor-wide``, ``floor-split``, ``floor-split-hot``: bench/suites/end_to_end_variants.py,
  ``bench.floor_layout`` in bench/lib/tasks.py): end to end, with real
  workers, the claim by key as a worker's is. Against each other they show what a layout
  costs; ``floor-wide`` against ``idem``, what the library adds on top of its table.

On PostgreSQL the claim and the commit do not wait for the WAL flush and the intent does,
as in the library's default mode; on MySQL every commit is flushed, as the library's are.

Layouts (``LAYOUTS``):

- ``current``: the job table as the migrations leave it (``LIKE celery_idem_job
  INCLUDING ALL``: every index, fillfactor 70);
- ``bare``: the least a job table could be: the key and the moving columns, no index
  but the primary key and the unique key (no arguments, no stored message, nothing for
  recovery or the admin to read by: claim and commit are HOT), the library's statements;
- ``payload``: the write-once JSON (arguments, options, envelope) in a one-to-one side
  table written with the intent (one statement: a CTE);
- ``split``: the identity and everything written once (key, task, arguments, envelope,
  created) with the indexes on them in one table; what the claim and the commit move
  (state, attempt, worker, task id, lease, result, times) with the state indexes in a
  narrow one-to-one table;
- ``split_hot``: ``split`` with no index on the narrow table but its primary key, so the
  claim and the commit are HOT (the reaper and the admin would then scan it: the lower
  bound of the idea, not a layout to ship);
- ``lean``: ``current`` without ``celery_idem_job_created_idx``;
- ``current_ff50``: ``current`` with fillfactor 50 instead of 70.

Parameters (named): the intent takes ``namespace``, ``key``, ``task_name``,
``fingerprint``, ``args``, ``kwargs``, ``options``, ``message``, ``task_id`` and returns
``(id,)``; the claims take ``worker`` and ``task_id``, and ``id`` or ``namespace`` and
``key``, and return ``(id, attempt)`` (none when the job is not PENDING); the commit takes
``id``, ``attempt`` and ``result``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

SCHEMA = "bench_layouts"

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
    "CREATE INDEX ON {t} USING hash (task_id)",
]
_JOB, _HOT = f"{SCHEMA}.job", f"{SCHEMA}.job_hot"
#: What the library stores of a benchmark task's message (the lean envelope of a task that
#: ignores its result: celery_idem/lean_envelope.py).
LEAN_MESSAGE = '{"v": 2, "headers": {"ignore_result": true}}'


def library_values(namespace: str, key: str, queue: str) -> dict[str, str]:
    """An intent's values as the library's row holds them for a benchmark task of one
    argument, ``key``, that ignores its result (the task name is the namespace)."""
    args = json.dumps([key])
    return {"namespace": namespace, "key": key, "task_name": namespace,
            "fingerprint": hashlib.sha256(args.encode()).hexdigest(), "args": args,
            "kwargs": "{}", "options": json.dumps({"queue": queue}), "message": LEAN_MESSAGE}


def _one_table(drop: tuple[str, ...] = (), fillfactor: int = 70) -> list[str]:
    return [f"CREATE TABLE {_JOB} (LIKE public.celery_idem_job INCLUDING ALL)"
            f" WITH (fillfactor = {fillfactor})",
            *(f"DROP INDEX {SCHEMA}.{name}" for name in drop)]


def _split(state_indexes: bool) -> list[str]:
    ddl = [f"CREATE TABLE {_JOB} ({_IDENTITY}, {_BLOBS})",
           *(i.format(t=_JOB) for i in _IDENTITY_INDEXES),
           # task_name and created_at copied (written once) for the census and attention
           # indexes, which name the state.
           f"CREATE TABLE {_HOT} (job_id bigint PRIMARY KEY, task_name varchar(200) NOT NULL,"
           f" created_at timestamptz NOT NULL, {_MOVING}) WITH (fillfactor = 70)"]
    return ddl + ([i.format(t=_HOT) for i in _STATE_INDEXES] if state_indexes else [])


@dataclass(frozen=True)
class Layout:
    ddl: list[str]
    intent: str
    claim_by_key: str
    commit: str
    claim_by_id: str = ""  # PostgreSQL's, for wal_layouts.py
    claim_read: str = ""  # MySQL's: the claim's row read back, (id, attempt)


_COLS = ("namespace, key, task_name, fingerprint, created_at, args, kwargs, options, message,"
         " state, task_id, updated_at, sent_at")
_VALS = ("%(namespace)s, %(key)s, %(task_name)s, %(fingerprint)s, now(), %(args)s,"
         " %(kwargs)s, %(options)s, %(message)s, 'PENDING', %(task_id)s, now(), now()")
# The claim and the commit do not wait for the WAL flush, as the library's default mode's
# (its stored routines set this per transaction too); the intent's commit does.
_UNFLUSHED = "WITH unflushed AS (SELECT set_config('synchronous_commit', 'off', true)) "
_CLAIM = (_UNFLUSHED + "UPDATE {table} SET state = 'RUNNING', attempt = attempt + 1, worker ="
          " %(worker)s, task_id = %(task_id)s, lease_expires_at = now() + interval '1 hour',"
          " not_before = NULL, started_at = now(), updated_at = now() FROM unflushed"
          " WHERE {id} = {which} AND state = 'PENDING' RETURNING {id}, attempt")
_BY_KEY = f"(SELECT id FROM {_JOB} WHERE namespace = %(namespace)s AND key = %(key)s)"
_COMMIT = (_UNFLUSHED + "UPDATE {table} SET state = 'SUCCEEDED', updated_at = now(),"
           " finished_at = now(), lease_expires_at = NULL, result = %(result)s FROM unflushed"
           " WHERE {id} = %(id)s AND state = 'RUNNING' AND attempt = %(attempt)s")


def _moves(table: str, id_column: str) -> dict[str, str]:
    return {"claim_by_id": _CLAIM.format(table=table, id=id_column, which="%(id)s"),
            "claim_by_key": _CLAIM.format(table=table, id=id_column, which=_BY_KEY),
            "commit": _COMMIT.format(table=table, id=id_column)}


_ONE_TABLE_INTENT = (f"INSERT INTO {_JOB} ({_COLS}, attempt, worker, dispatch_count) VALUES"
                     f" ({_VALS}, 0, '', 0) ON CONFLICT (namespace, key) DO NOTHING RETURNING id")
_PAYLOAD_INTENT = (
    f"WITH ins AS (INSERT INTO {_JOB} (namespace, key, task_name, fingerprint, created_at,"
    " state, task_id, updated_at, sent_at, attempt, worker, dispatch_count) VALUES"
    " (%(namespace)s, %(key)s, %(task_name)s, %(fingerprint)s, now(), 'PENDING',"
    " %(task_id)s, now(), now(), 0, '', 0) ON CONFLICT (namespace, key) DO NOTHING"
    f" RETURNING id), p AS (INSERT INTO {SCHEMA}.job_payload SELECT id, %(args)s,"
    " %(kwargs)s, %(options)s, %(message)s FROM ins) SELECT id FROM ins")
_BARE_INTENT = (f"INSERT INTO {_JOB} (namespace, key, state, task_id, updated_at) VALUES"
                " (%(namespace)s, %(key)s, 'PENDING', %(task_id)s, now())"
                " ON CONFLICT (namespace, key) DO NOTHING RETURNING id")
_SPLIT_INTENT = (
    f"WITH ins AS (INSERT INTO {_JOB} (namespace, key, task_name, fingerprint, created_at,"
    " args, kwargs, options, message) VALUES (%(namespace)s, %(key)s, %(task_name)s,"
    " %(fingerprint)s, now(), %(args)s, %(kwargs)s, %(options)s, %(message)s)"
    " ON CONFLICT (namespace, key) DO NOTHING RETURNING id, task_name, created_at),"
    f" h AS (INSERT INTO {_HOT} (job_id, task_name, created_at, state, task_id, updated_at,"
    " sent_at) SELECT id, task_name, created_at, 'PENDING', %(task_id)s, now(), now()"
    " FROM ins) SELECT id FROM ins")
_ONE_TABLE_MOVES = _moves(_JOB, "id")
#: The bare table's claim with no intent before it (durability "broker"): it inserts the
#: row, or takes a PENDING one; (namespace, key, worker, task_id) -> (id, attempt).
BARE_CLAIM_UPSERT = (
    _UNFLUSHED + f"INSERT INTO {_JOB} AS job (namespace, key, state, attempt, worker, task_id,"
    " lease_expires_at, started_at, updated_at) SELECT %(namespace)s, %(key)s, 'RUNNING', 1,"
    " %(worker)s, %(task_id)s, now() + interval '1 hour', now(), now() FROM unflushed"
    " ON CONFLICT (key, namespace) DO UPDATE SET state = 'RUNNING', attempt = job.attempt + 1,"
    " worker = EXCLUDED.worker, task_id = EXCLUDED.task_id, lease_expires_at ="
    " EXCLUDED.lease_expires_at, started_at = now(), updated_at = now()"
    " WHERE job.state = 'PENDING' RETURNING id, attempt")
_SPLIT_MOVES = _moves(_HOT, "job_id")

LAYOUTS: dict[str, Layout] = {
    "current": Layout(_one_table(), _ONE_TABLE_INTENT, **_ONE_TABLE_MOVES),
    "bare": Layout([f"CREATE TABLE {_JOB} (id bigserial PRIMARY KEY, namespace varchar(200)"
                    f" NOT NULL, key varchar(255) NOT NULL, {_MOVING}, UNIQUE (key, namespace))"],
                   _BARE_INTENT, **_ONE_TABLE_MOVES),
    "payload": Layout(_one_table() + [
        f"ALTER TABLE {_JOB} DROP COLUMN args, DROP COLUMN kwargs, DROP COLUMN options,"
        " DROP COLUMN message",
        f"CREATE TABLE {SCHEMA}.job_payload (job_id bigint PRIMARY KEY, {_BLOBS})"],
        _PAYLOAD_INTENT, **_ONE_TABLE_MOVES),
    "split": Layout(_split(state_indexes=True), _SPLIT_INTENT, **_SPLIT_MOVES),
    "split_hot": Layout(_split(state_indexes=False), _SPLIT_INTENT, **_SPLIT_MOVES),
    "lean": Layout(_one_table(drop=("job_created_at_idx",)), _ONE_TABLE_INTENT,
                   **_ONE_TABLE_MOVES),
    "current_ff50": Layout(_one_table(fillfactor=50), _ONE_TABLE_INTENT, **_ONE_TABLE_MOVES),
}


# -- MySQL/MariaDB: the least table and today's ------------------------------------------
# A table of the benchmark database, no schema of its own. No UPDATE ... RETURNING: the
# claim is its UPDATE, then ``claim_read``, as the library's MySQL backend does it
# (mysql.sql: `claim`, then `row`). Every commit is flushed, as the library's are there.
_M_JOB = "bench_layouts_job"
_M_NOW = "UTC_TIMESTAMP(6)"
_M_KEY = ("namespace varchar(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,"
          " `key` varchar(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL")
_M_MOVING = ("state varchar(16) NOT NULL, attempt int unsigned NOT NULL DEFAULT 0, worker"
             " varchar(255) NOT NULL DEFAULT '', task_id varchar(255) NOT NULL, lease_expires_at"
             " datetime(6), not_before datetime(6), dispatch_count int unsigned NOT NULL DEFAULT"
             " 0, result json, error json, started_at datetime(6), finished_at datetime(6),"
             " updated_at datetime(6) NOT NULL, sent_at datetime(6)")
_M_WHERE_KEY = "WHERE `key` = %(key)s AND namespace = %(namespace)s"
_M_MOVES = {
    "claim_by_key": f"UPDATE {_M_JOB} SET state = 'RUNNING', attempt = attempt + 1, worker ="
                    f" %(worker)s, task_id = %(task_id)s, lease_expires_at = {_M_NOW} +"
                    f" INTERVAL 1 HOUR, not_before = NULL, started_at = {_M_NOW}, updated_at ="
                    f" {_M_NOW} {_M_WHERE_KEY} AND state = 'PENDING'",
    "claim_read": f"SELECT id, attempt FROM {_M_JOB} {_M_WHERE_KEY}",
    "commit": f"UPDATE {_M_JOB} SET state = 'SUCCEEDED', updated_at = {_M_NOW}, finished_at ="
              f" {_M_NOW}, lease_expires_at = NULL, result = %(result)s WHERE id = %(id)s"
              " AND state = 'RUNNING' AND attempt = %(attempt)s",
}
MYSQL_LAYOUTS: dict[str, Layout] = {
    "bare": Layout([f"CREATE TABLE {_M_JOB} (id bigint AUTO_INCREMENT PRIMARY KEY, {_M_KEY},"
                    f" {_M_MOVING}, UNIQUE (`key`, namespace))"],
                   f"INSERT INTO {_M_JOB} (namespace, `key`, state, task_id, updated_at) VALUES"
                   f" (%(namespace)s, %(key)s, 'PENDING', %(task_id)s, {_M_NOW})", **_M_MOVES),
    "current": Layout([f"CREATE TABLE {_M_JOB} LIKE celery_idem_job"],
                      f"INSERT INTO {_M_JOB} (namespace, `key`, task_name, fingerprint, created_at,"
                      " args, kwargs, options, message, state, task_id, updated_at, sent_at,"
                      " attempt, worker, dispatch_count) VALUES (%(namespace)s, %(key)s,"
                      f" %(task_name)s, %(fingerprint)s, {_M_NOW}, %(args)s, %(kwargs)s,"
                      f" %(options)s, %(message)s, 'PENDING', %(task_id)s, {_M_NOW}, {_M_NOW},"
                      " 0, '', 0)", **_M_MOVES),
}
#: The least table's claim with no intent before it, on MySQL: the INSERT of the claimed
#: row (attempt 1); on a duplicate key, ``claim_by_key`` and ``claim_read``.
MYSQL_BARE_CLAIM_INSERT = (
    f"INSERT INTO {_M_JOB} (namespace, `key`, state, attempt, worker, task_id,"
    f" lease_expires_at, started_at, updated_at) VALUES (%(namespace)s, %(key)s, 'RUNNING',"
    f" 1, %(worker)s, %(task_id)s, {_M_NOW} + INTERVAL 1 HOUR, {_M_NOW}, {_M_NOW})")


def layouts(vendor: str) -> dict[str, Layout]:
    """The layouts a Django database vendor has here."""
    return LAYOUTS if vendor == "postgresql" else MYSQL_LAYOUTS


def create(cursor, name: str, vendor: str = "postgresql") -> None:
    """(Re)create layout ``name``'s tables, alone in the schema (on MySQL, the table)."""
    if vendor == "postgresql":
        cursor.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        cursor.execute(f"CREATE SCHEMA {SCHEMA}")
    else:
        cursor.execute(f"DROP TABLE IF EXISTS {_M_JOB}")
    for sql in layouts(vendor)[name].ddl:
        cursor.execute(sql)


def drop(cursor) -> None:
    cursor.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
