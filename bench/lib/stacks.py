"""The database stacks a benchmark runs on (``--database``), and what it measures of each.

- ``postgres``: the shared PostgreSQL, directly (``IDEM_PG_PORT``, default 5432);
- ``pgbouncer``: the same server behind a PgBouncer of the run's own in transaction
  pooling mode (tests/services/pgbouncer.py, started here and stopped at the end), the
  producer and every worker connected through it, as docs/how-to/pgbouncer.md ("Run behind
  PgBouncer") sets a project up (``DISABLE_SERVER_SIDE_CURSORS``, no prepared statements:
  the library's default). Its pool is PgBouncer's default size (20), larger than the
  run's clients: what is measured is the pooler in the path, not clients queueing;
- ``mysql``: MariaDB (or MySQL) through Django's mysql backend and the library's
  portable backend (``IDEM_MYSQL_NAME``, default ``idem_bench``, on ``IDEM_MYSQL_HOST``,
  default the shared server on 127.0.0.1:3306, user root);
- ``sqlite``: the test project's SQLite file under ``IDEM_VAR_DIR`` (WAL, synchronous
  NORMAL), for the suites that count rather than time (``counts``).

What a run reads of the database, per stack: the CPU of the database's processes (the
PostgreSQL backends connected to the benchmark database; MariaDB's whole ``mariadbd``,
shared with anything else using it; PgBouncer's own process as a group of its own), and
on PostgreSQL the WAL and the sessions opened, read on a connection of their own to the
server itself (never through the pooler, so the pooler carries only the workload).
MariaDB has no per-database WAL or session figures: they are None (n/a).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.lib import common as c
from bench.lib.common import close_django_connections

STACKS = ("postgres", "pgbouncer", "mysql", "sqlite")
#: Variants that need PostgreSQL itself (raw psycopg workers, PostgreSQL SQL, a patch of
#: the PostgreSQL backend): not run on MariaDB.
POSTGRES_ONLY = ("raw", "floor", "pub-async", "floor-split", "floor-split-hot")
#: The database server's CPU group in a run's ``cpu_us_per_task``, per stack.
DB_GROUP = {"postgres": "postgres", "pgbouncer": "postgres", "mysql": "mariadb",
            "sqlite": "sqlite"}
#: PgBouncer's own default_pool_size.
PGBOUNCER_POOL_SIZE = 20


def pids_named(*names: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() in names:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


class Stack:
    """The stack of one run: its environment while open, its measurements."""

    def __init__(self, name: str, bouncer: Any = None) -> None:
        if name not in STACKS:
            raise SystemExit(f"unknown database {name!r}; choose from {STACKS}")
        self.name = name
        self.bouncer = bouncer
        self.postgres = name in ("postgres", "pgbouncer")
        self._direct: Any = None
        self._walinspect: bool | None = None

    # -- the server itself, on a connection of the benchmark's own -----------------------

    def direct(self) -> Any:
        """An autocommit psycopg connection to the benchmark database on the server itself."""
        if self._direct is None or self._direct.closed:
            import psycopg

            self._direct = psycopg.connect(
                dbname=os.environ["IDEM_PG_NAME"], autocommit=True,
                host=os.environ.get("IDEM_PG_HOST", "127.0.0.1"),
                port=int(os.environ.get("IDEM_PG_DIRECT_PORT")
                         or os.environ.get("IDEM_PG_PORT", "5432")),
                user=os.environ.get("IDEM_PG_USER", "postgres"))
        return self._direct

    def query(self, sql: str, params: Any = ()) -> Any:
        return self.direct().execute(sql, params).fetchone()

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
            self._direct = None

    # -- CPU groups ------------------------------------------------------------------------

    def server_groups(self) -> dict[str, list[int]]:
        """The database's process groups: name -> pids (sampled before and after a run)."""
        group = DB_GROUP[self.name]
        if not self.postgres:
            return {group: pids_named("mariadbd", "mysqld")}
        rows = self.direct().execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()").fetchall()
        groups = {group: [r[0] for r in rows]}
        if self.bouncer is not None:
            groups["pgbouncer"] = [self.bouncer.process.pid]
        return groups

    # -- sessions and WAL (PostgreSQL only) -------------------------------------------------

    def sessions_opened(self) -> int | None:
        """Server sessions ever opened to the benchmark database (behind PgBouncer: the
        pooler's server connections, not its clients'); None on MariaDB."""
        if not self.postgres:
            return None
        self.query("SELECT pg_stat_force_next_flush()")
        return int(self.query("SELECT sessions FROM pg_stat_database"
                              " WHERE datname = current_database()")[0])

    def pooler_transactions(self) -> int | None:
        """Transactions PgBouncer has passed to the benchmark database (SHOW STATS): shows
        the run's traffic went through it; None without a pooler."""
        if self.bouncer is None:
            return None
        name = os.environ["IDEM_PG_NAME"]
        return sum(int(row["total_xact_count"]) for row in self.bouncer.admin("SHOW STATS")
                   if row["database"] == name)

    def wal_lsn(self) -> str | None:
        # The flushed position: pg_walinspect refuses a start it has not flushed yet.
        return str(self.query("SELECT pg_current_wal_flush_lsn()")[0]) if self.postgres else None

    def wal_bytes(self, since: str | None) -> tuple[int | None, int | None]:
        """WAL written since ``since``: (cluster-wide, this database's own). The latter reads
        the records with pg_walinspect: those touching a relation of this database, and the
        commit records of their transactions; None without the extension, both None on
        MariaDB."""
        import psycopg

        if since is None:
            return None, None
        until, cluster, oid = self.query(
            "SELECT pg_current_wal_lsn(), pg_wal_lsn_diff(pg_current_wal_lsn(), %s),"
            " (SELECT oid FROM pg_database WHERE datname = current_database())", [since])
        if not self._has_walinspect():
            return int(cluster), None
        if cluster <= 0:
            return 0, 0  # nothing written (pg_walinspect refuses an empty range)
        # pg_walinspect reads only flushed WAL; asynchronous commits flush within
        # wal_writer_delay (200 ms by default).
        c.wait_for(lambda: self.query("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn",
                                      [str(until)])[0], 10, "the WAL flush", interval=0.05)
        mine = f"%/{oid}/%"
        try:
            row = self.query(
                "WITH r AS (SELECT xid::text AS xid, record_length, block_ref"
                "  FROM pg_get_wal_records_info(%s, %s)),"
                " ours AS (SELECT DISTINCT xid FROM r WHERE block_ref LIKE %s AND xid <> '0')"
                " SELECT coalesce(sum(record_length), 0) FROM r WHERE block_ref LIKE %s"
                " OR (block_ref = '' AND xid IN (SELECT xid FROM ours))",
                [since, str(until), mine, mine])
        except (psycopg.OperationalError, psycopg.InternalError) as exc:
            # On a shared server other sessions' WAL can get the run's segments recycled
            # before they are read ("has already been removed"): no figure for this run.
            c.log(f"WAL of the run not readable, left out: {exc}")
            return int(cluster), None
        return int(cluster), int(row[0])

    def _has_walinspect(self) -> bool:
        """pg_walinspect (PostgreSQL 15+, superuser) in the benchmark database, once."""
        if self._walinspect is None:
            try:
                self.direct().execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                self._walinspect = True
            except Exception as exc:  # noqa: BLE001 - older server or no privilege
                c.log(f"pg_walinspect unavailable, WAL is cluster-wide only: {exc}")
                self._walinspect = False
        return self._walinspect

    def describe(self) -> dict[str, Any]:
        """For the results file: the stack and its servers' versions."""
        out: dict[str, Any] = {"database": self.name}
        if self.bouncer is not None:
            exe = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
            version = subprocess.run([exe, "--version"], capture_output=True, text=True,
                                     timeout=10).stdout.split("\n")[0]
            out["pgbouncer"] = {"version": version, "pool_mode": "transaction",
                                "default_pool_size": self.bouncer.pool_size,
                                "pid": self.bouncer.process.pid, "port": self.bouncer.port}
        if not self.postgres:
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@log_bin,"
                               " @@innodb_buffer_pool_size")
                version, flush, log_bin, pool = cursor.fetchone()
            out["mariadb"] = {"version": version, "innodb_flush_log_at_trx_commit": flush,
                              "log_bin": log_bin, "innodb_buffer_pool_size": pool,
                              "shared": "mariadbd's CPU is the whole server's"}
        return out


@contextmanager
def opened(name: str) -> Iterator[Stack]:
    """Set the environment for ``name`` (before django.setup and before any worker starts:
    the workers inherit it); for ``pgbouncer``, start one, and stop it at the end."""
    saved = {k: os.environ.get(k) for k in ("IDEM_DATABASE", "IDEM_PG_PORT", "IDEM_PGBOUNCER",
                                            "IDEM_PG_DIRECT_PORT", "IDEM_MYSQL_NAME")}
    stack = Stack(name)
    os.environ["IDEM_DATABASE"] = name if name in ("mysql", "sqlite") else "postgres"
    if name == "mysql":
        os.environ.setdefault("IDEM_MYSQL_NAME", os.environ.get("IDEM_PG_NAME", "idem_bench"))
    if name == "pgbouncer":
        from tests.services import pgbouncer

        upstream = int(os.environ.get("IDEM_PG_PORT", "5432"))
        stack.bouncer = pgbouncer.start(upstream_port=upstream, pool_size=PGBOUNCER_POOL_SIZE)
        os.environ.update(pgbouncer.environment(stack.bouncer))
    try:
        yield stack
    finally:
        stack.close()
        if stack.bouncer is not None:
            close_django_connections()
            stack.bouncer.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
