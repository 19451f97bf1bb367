"""What a block of code asks of the database, counted (the counts suite, its test).

Each counter is a context manager around a loop of ``n`` operations; ``result(n)`` gives
per-operation figures. The counts do not depend on the machine's load:

- **PostgreSQL** (direct or behind PgBouncer): the libpq protocol trace of every
  connection the process uses (Django's, the bookkeeping ones): *statements* are the
  Query and Execute messages sent (transaction control included, and counted apart),
  *round trips* the times the client waited (a run of messages sent followed by a run
  received: a pipeline of several statements is one). *Commits* are the transactions
  that changed a row: a deferred constraint trigger on the job, history, checkpoint and
  effect tables (installed by ``pg_triggers`` in the benchmark's own database, for the
  counting pass only) raises a notice at each commit that changed one, with that
  commit's ``synchronous_commit``; a commit whose setting is not ``off`` waited for the
  WAL *flush*. From the WAL (pg_walinspect, this database's records only: the server
  is shared): bytes without full-page images, heap inserts, updates and HOT updates,
  and index entries (B-tree leaf inserts and splits, hash inserts), per relation.
- **MariaDB**: the session's own status counters (``Questions``: every statement is a
  round trip; ``Com_commit``), and the statements Django's cursors ran (an autocommitted
  write that changed a row commits). With ``innodb_flush_log_at_trx_commit = 1``
  every commit that wrote flushes the redo log.
- **SQLite**: every statement SQLite ran (its trace callback, transaction control
  included), and which changed rows (its ``total_changes``); no round trips (in
  process); a commit flushes only as ``synchronous`` and the journal mode say (WAL with
  NORMAL: never).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from bench.lib import common as c

CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "START TRANSACTION",
           "SET AUTOCOMMIT", "END")
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")
#: The tables whose changes make a commit count (PostgreSQL's triggers).
TABLES = ("celery_idem_job", "celery_idem_transition", "celery_idem_checkpoint",
          "effects_effect")
NOTICE = "bench-counts commit"
_NOTICE = re.compile(r'M "bench-counts commit (\d+) (\w+)"')
_REL = re.compile(r"rel \d+/(\d+)/(\d+)")
#: WAL records that write an index entry (a leaf split carries the new item).
INDEX_ENTRY = {("Btree", "INSERT_LEAF"), ("Btree", "INSERT_POST"), ("Btree", "SPLIT_L"),
               ("Btree", "SPLIT_R"), ("Hash", "INSERT")}


def control(sql: str) -> bool:
    return sql.lstrip().upper().startswith(CONTROL)


def writes(sql: str) -> bool:
    s = sql.lstrip().upper()
    if s.startswith("WITH"):
        return any(f" {w} " in f" {s} " for w in WRITES)
    return s.startswith(WRITES)


def per(value: float, n: int) -> float:
    return round(value / n, 2)


# -- PostgreSQL ---------------------------------------------------------------------------

def pg_triggers(direct: Any, install: bool) -> None:
    """The counting pass's commit probes, on ``direct`` (a psycopg connection to the
    benchmark database itself): installed, or dropped (``install`` False)."""
    for table in TABLES:
        direct.execute(f"DROP TRIGGER IF EXISTS bench_counts_commit ON {table}")
    if not install:
        direct.execute("DROP FUNCTION IF EXISTS bench_counts_commit()")
        return
    direct.execute(
        "CREATE OR REPLACE FUNCTION bench_counts_commit() RETURNS trigger LANGUAGE plpgsql"
        " AS $$ BEGIN RAISE NOTICE '" + NOTICE + " % %', txid_current(),"
        " current_setting('synchronous_commit'); RETURN NULL; END $$")
    for table in TABLES:
        direct.execute(f"CREATE CONSTRAINT TRIGGER bench_counts_commit AFTER INSERT OR UPDATE"
                       f" OR DELETE ON {table} DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
                       " EXECUTE FUNCTION bench_counts_commit()")


def parse_trace(text: str) -> dict[str, Any]:
    """A libpq trace's statements, round trips and commits (the probes' notices)."""
    statements = transaction = round_trips = 0
    last_parse = ""
    commits: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split("\t", 4)
        if len(parts) < 4:
            continue
        direction, kind = parts[1], parts[3]
        rest = parts[4] if len(parts) > 4 else ""
        if direction == "F":
            if kind == "Parse":
                last_parse = rest.split('"', 4)[3] if rest.count('"') >= 4 else ""
            elif kind in ("Query", "Execute"):
                statements += 1
                sql = rest.strip().strip('"') if kind == "Query" else last_parse
                transaction += control(sql)
        elif direction == "B":
            round_trips += kind == "ReadyForQuery"
            if kind == "NoticeResponse":
                found = _NOTICE.search(rest)
                if found:
                    commits[found[1]] = found[2]
    return {"statements": statements, "transaction_control": transaction,
            "round_trips": round_trips, "commits": len(commits),
            "flushes": sum(setting != "off" for setting in commits.values())}


class PostgresCounter:
    """Counts on ``wrappers`` (label -> Django DatabaseWrapper) and the WAL of the
    benchmark database, read on ``direct`` (a psycopg connection to it, not counted)."""

    def __init__(self, wrappers: dict[str, Any], direct: Any) -> None:
        self.wrappers = wrappers
        self.direct = direct
        self.traces: dict[str, str] = {}
        self.lsns: tuple[str, str] = ("", "")

    def _lsn(self) -> str:
        return str(self.direct.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0])

    @contextmanager
    def counting(self) -> Iterator[None]:
        files = {}
        for label, wrapper in self.wrappers.items():
            wrapper.ensure_connection()
            handle = tempfile.TemporaryFile("w+")
            wrapper.connection.pgconn.trace(handle.fileno())
            files[label] = (wrapper.connection.pgconn, handle)
        start = self._lsn()
        try:
            yield
        finally:
            end = self._lsn()
            for label, (pgconn, handle) in files.items():
                pgconn.untrace()
                handle.seek(0)
                self.traces[label] = handle.read()
                handle.close()
            self.lsns = (start, end)

    def result(self, n: int) -> dict[str, Any]:
        total: Tally[str] = Tally()
        by_connection = {}
        for label, text in self.traces.items():
            counted = parse_trace(text)
            by_connection[label] = {k: per(v, n) for k, v in counted.items()}
            total.update(counted)
        out: dict[str, Any] = {k: per(total[k], n) for k in (
            "statements", "transaction_control", "round_trips", "commits", "flushes")}
        out["by_connection"] = by_connection
        out.update(self.wal(n))
        return out

    def wal(self, n: int) -> dict[str, Any]:
        start, end = self.lsns
        query = self.direct.execute
        query("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        oid = str(query("SELECT oid FROM pg_database WHERE datname = current_database()")
                  .fetchone()[0])
        # pg_walinspect reads flushed WAL only (an unflushed commit is flushed within
        # wal_writer_delay).
        c.wait_for(lambda: query("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn",
                                 [end]).fetchone()[0], 10, "the WAL flush", interval=0.05)
        rows = query("SELECT xid::text, resource_manager, record_type, record_length,"
                     " fpi_length, block_ref FROM pg_get_wal_records_info(%s, %s)",
                     [start, end]).fetchall() if start != end else []
        names = {str(node): name for node, name in query(
            "SELECT relfilenode, relname FROM pg_class WHERE relfilenode <> 0").fetchall()}
        ours, xids = [], set()
        for xid, rmgr, rtype, length, fpi, blocks in rows:
            rels = [node for db, node in _REL.findall(blocks or "") if db == oid]
            if rels:
                xids.add(xid)
            ours.append((xid, rmgr, rtype, int(length) - int(fpi or 0),
                         names.get(rels[0], rels[0]) if rels else None))
        wal = index = 0
        heap: dict[str, Tally[str]] = {}
        indexes: Tally[str] = Tally()
        commit_records = 0
        for xid, rmgr, rtype, length, rel in ours:
            if rel is None and (xid not in xids or xid == "0"):
                continue  # another database's
            wal += length
            kind = rtype.split("+")[0]
            if (rmgr, kind) in INDEX_ENTRY:
                index += 1
                indexes[rel] += 1
            elif rmgr == "Heap" and kind in ("INSERT", "UPDATE", "HOT_UPDATE", "DELETE",
                                             "LOCK"):
                heap.setdefault(rel, Tally())[kind.lower()] += 1
            elif rmgr == "Transaction" and kind == "COMMIT":
                commit_records += 1
        return {"wal_bytes": per(wal, n), "index_entries": per(index, n),
                "heap_inserts": per(sum(t["insert"] for t in heap.values()), n),
                "updates": per(sum(t["update"] for t in heap.values()), n),
                "hot_updates": per(sum(t["hot_update"] for t in heap.values()), n),
                "commit_records": per(commit_records, n),
                "heap_by_table": {rel: {k: per(v, n) for k, v in t.items()}
                                  for rel, t in sorted(heap.items())},
                "index_entries_by_index": {rel: per(v, n)
                                           for rel, v in indexes.most_common()}}


# -- MariaDB ------------------------------------------------------------------------------

STATUS = ("Questions", "Com_commit", "Handler_write", "Handler_update", "Handler_delete")
#: Transaction control, as MariaDB counts it (``SET autocommit`` is ``Com_set_option``).
CONTROL_STATUS = ("Com_begin", "Com_commit", "Com_rollback", "Com_savepoint",
                  "Com_release_savepoint", "Com_rollback_to_savepoint", "Com_set_option")


def _status(wrapper: Any) -> dict[str, int]:
    with wrapper.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS WHERE Variable_name IN ("
                       + ", ".join(f"'{name}'" for name in {*STATUS, *CONTROL_STATUS}) + ")")
        return {name: int(value) for name, value in cursor.fetchall()}


class MySQLCounter:
    """Counts on ``wrapper`` (Django's MySQL connection: the only one the library uses)."""

    def __init__(self, wrapper: Any) -> None:
        self.wrapper = wrapper
        self.delta: dict[str, int] = {}
        self.autocommitted_writes = 0
        self.flushing = True

    @contextmanager
    def counting(self) -> Iterator[None]:
        wrapper = self.wrapper
        wrapper.ensure_connection()
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT @@innodb_flush_log_at_trx_commit")
            self.flushing = int(cursor.fetchone()[0]) == 1

        def observe(execute: Callable[..., Any], sql: str, params: Any, many: bool,
                    context: dict[str, Any]) -> Any:
            autocommit = wrapper.get_autocommit()
            result = execute(sql, params, many, context)
            if autocommit and writes(sql) and context["cursor"].rowcount > 0:
                self.autocommitted_writes += 1
            return result

        before = _status(wrapper)
        try:
            with wrapper.execute_wrapper(observe):
                yield
        finally:
            after = _status(wrapper)
            self.delta = {k: after[k] - before[k] for k in {*STATUS, *CONTROL_STATUS}}
            self.delta["Questions"] -= 1  # the second status read itself

    def result(self, n: int) -> dict[str, Any]:
        d = self.delta
        commits = d["Com_commit"] + self.autocommitted_writes
        return {"statements": per(d["Questions"], n),
                "transaction_control": per(sum(d[k] for k in CONTROL_STATUS), n),
                "round_trips": per(d["Questions"], n),
                "commits": per(commits, n), "flushes": per(commits if self.flushing else 0, n),
                "rows_written": per(d["Handler_write"], n),
                "rows_updated": per(d["Handler_update"], n)}


# -- SQLite -------------------------------------------------------------------------------

class SQLiteCounter:
    """Counts every statement SQLite runs on ``wrapper`` (Django's SQLite connection)."""

    def __init__(self, wrapper: Any) -> None:
        self.wrapper = wrapper
        self.statements: list[str] = []
        #: SQLite's count of changed rows before each statement, and at the end.
        self.changes: list[int] = []
        self.flushing = False

    @contextmanager
    def counting(self) -> Iterator[None]:
        wrapper = self.wrapper
        wrapper.ensure_connection()
        with wrapper.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode")
            journal = cursor.fetchone()[0].lower()
            cursor.execute("PRAGMA synchronous")
            synchronous = int(cursor.fetchone()[0])
        # WAL syncs at commit only with FULL (2); a rollback journal with NORMAL too.
        self.flushing = synchronous >= (2 if journal == "wal" else 1)
        raw = wrapper.connection

        def trace(sql: str) -> None:
            self.statements.append(sql)
            self.changes.append(raw.total_changes)

        raw.set_trace_callback(trace)
        try:
            yield
        finally:
            raw.set_trace_callback(None)
            self.changes.append(raw.total_changes)

    def result(self, n: int) -> dict[str, Any]:
        commits = 0
        inside = wrote = False
        for i, sql in enumerate(self.statements):
            word = sql.lstrip().upper()
            changed = self.changes[i + 1] > self.changes[i]
            if word.startswith("BEGIN"):
                inside, wrote = True, False
            elif word.startswith(("COMMIT", "END")):
                commits += wrote
                inside = False
            elif word.startswith("ROLLBACK") and not word.startswith("ROLLBACK TO"):
                inside = False
            elif changed:
                if inside:
                    wrote = True
                else:
                    commits += 1
        return {"statements": per(len(self.statements), n),
                "transaction_control": per(sum(control(s) for s in self.statements), n),
                "round_trips": None, "commits": per(commits, n),
                "flushes": per(commits if self.flushing else 0, n)}


# -- the counter of a stack -----------------------------------------------------------------

def connections_in_use() -> dict[str, Any]:
    """Django's connection and, on PostgreSQL, every bookkeeping connection this process
    has opened (``celery_idem.connection``), by label."""
    from django.db import connection

    found = {"django": connection}
    if connection.vendor == "postgresql":
        from celery_idem import connection as bookkeeping

        for i, wrapper in enumerate(sorted(bookkeeping._opened, key=id)):
            found[f"bookkeeping{i or ''}"] = wrapper
    return found


def counter(direct: Any = None) -> Any:
    """A counter for this process's database (``direct``: PostgreSQL's, see
    ``PostgresCounter``)."""
    from django.db import connection

    if connection.vendor == "postgresql":
        return PostgresCounter(connections_in_use(), direct)
    if connection.vendor == "mysql":
        return MySQLCounter(connection)
    return SQLiteCounter(connection)


def count(fn: Callable[[], Any], n: int, direct: Any = None) -> dict[str, Any]:
    """Run ``fn`` (``n`` operations) under this database's counter: its figures per
    operation. Refuses a run that opened a connection the counter did not watch."""
    from django.db import connection

    before = set(map(id, connections_in_use().values()))
    found = counter(direct)
    with ExitStack() as stack:
        stack.enter_context(found.counting())
        fn()
    if connection.vendor == "postgresql" and set(map(id, connections_in_use().values())) - before:
        raise RuntimeError("a connection opened during the count: warm the path up first")
    return found.result(n)


def direct_connection() -> Any:
    """A psycopg connection to Django's PostgreSQL database on the server itself (behind
    PgBouncer too: ``IDEM_PG_DIRECT_PORT``), in autocommit, for what the counters read
    and install."""
    import psycopg
    from django.db import connection

    s = connection.settings_dict
    port = os.environ.get("IDEM_PG_DIRECT_PORT") if os.environ.get("IDEM_PGBOUNCER") == "1" \
        else None
    return psycopg.connect(dbname=s["NAME"], user=s["USER"], host=s["HOST"] or "127.0.0.1",
                           port=int(port or s["PORT"] or 5432), autocommit=True)
