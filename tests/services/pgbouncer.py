"""A private PgBouncer in transaction pooling mode, in front of the shared PostgreSQL.

Each run starts its own ``pgbouncer`` (Debian's package) on a free port of 127.0.0.1,
with its own configuration, user list and log in a temporary folder, and stops it at the
end: the shared PostgreSQL is never reconfigured. Its pool is small (``pool_size``
server connections per database and user), so clients really do share server sessions:
anything a client leaves on a session (a prepared statement, a ``SET``) reaches another
client, as it would in production.

The configuration is PgBouncer's defaults but for what a test run needs: no startup
parameter is ignored (a client that sends ``options`` is refused, as a stock PgBouncer
refuses it), ``server_reset_query`` is the default one (unused in transaction mode),
every database name goes to the upstream server (``* = ...``), so the test database a
run creates is reachable without listing it.

Used by the test runner for the ``pgbouncer+redis`` tier, by hand as a wrapper::

    python -m tests.services.pgbouncer -- python -m pytest tests/integration/test_duplicates.py

which starts one, runs the command with ``IDEM_PG_PORT`` pointing at it and
``IDEM_PGBOUNCER=1`` (django_app/settings.py), and stops it; by tests through
``admin()`` (its console: ``SHOW POOLS``, ``KILL``); and by the chaos suite
(tests/chaos/run.py ``--database pgbouncer``), in front of its own PostgreSQL cluster,
restarted on its port as a fault (``PgBouncer.restart``).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Debian's binary (the package puts it outside a normal user's PATH).
BINARIES = ("pgbouncer", "/usr/sbin/pgbouncer")
#: Server connections per (database, user): small, so clients share sessions.
POOL_SIZE = 3
#: The user PgBouncer runs as when started by root (it refuses to run as root).
RUN_AS = "postgres"

CONFIG = """\
[databases]
* = host={upstream_host} port={upstream_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/users.txt
admin_users = {user}
pool_mode = {pool_mode}
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 1000
logfile = {dir}/pgbouncer.log
{extra}"""


class PgBouncerError(RuntimeError):
    """PgBouncer could not be found or started."""


def binary() -> str | None:
    """Path of the pgbouncer binary, or None when it is not installed."""
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PgBouncer:
    """A running pgbouncer process: ``port`` to connect to, ``dir`` its files."""

    port: int
    dir: Path
    process: subprocess.Popen[bytes]
    user: str = "postgres"
    upstream_port: int = 5432
    pool_size: int = POOL_SIZE
    #: The command that started it (``restart`` runs it again).
    args: list[str] = field(default_factory=list)
    _stopped: bool = field(default=False, repr=False)

    def log(self) -> str:
        return _log(self.dir)

    def admin(self, command: str) -> list[dict[str, Any]]:
        return admin(self.port, command, self.user)

    def restart(self, timeout: float = 30.0) -> None:
        """Immediate shutdown, as ``stop``: every client and server connection dropped,
        transactions in flight cut; then the same configuration started again on the
        same port (connections are refused in between)."""
        self._shut_down()
        self.process = _launch(self.args, self.dir, self.port, timeout)

    def stop(self) -> None:
        """Stop at once (SIGTERM: PgBouncer's immediate shutdown) and remove its files."""
        if self._stopped:
            return
        self._stopped = True
        self._shut_down()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _shut_down(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


def start(upstream_host: str = "127.0.0.1", upstream_port: int = 5432,
          pool_size: int = POOL_SIZE, user: str = "postgres",
          ignore_startup_parameters: str = "", pool_mode: str = "transaction",
          timeout: float = 30.0, port: int | None = None) -> PgBouncer:
    """Start a pgbouncer in transaction mode on ``port`` (default: a free one); raise
    PgBouncerError if it is not installed or does not listen within ``timeout`` seconds.
    ``ignore_startup_parameters``: PgBouncer's setting of that name (e.g. ``options``, as
    some deployments set it: such a parameter is then dropped silently, not refused)."""
    executable = binary()
    if executable is None:
        raise PgBouncerError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
    workdir = Path(tempfile.mkdtemp(prefix="idem-pgbouncer-"))
    port = port or free_port()
    (workdir / "pgbouncer.ini").write_text(CONFIG.format(
        upstream_host=upstream_host, upstream_port=upstream_port, port=port, dir=workdir,
        user=user, pool_size=pool_size, pool_mode=pool_mode,
        extra=(f"ignore_startup_parameters = {ignore_startup_parameters}\n"
               if ignore_startup_parameters else "")))
    # trust: no password is checked, but the user must be listed.
    (workdir / "users.txt").write_text(f'"{user}" ""\n')
    args = [executable]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root: it drops to RUN_AS, who must own its files.
        owner = pwd.getpwnam(RUN_AS)
        for path in (workdir, *workdir.iterdir()):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        args += ["-u", RUN_AS]
    # -q: it logs to its logfile only (to stderr as well otherwise, and a pipe nobody
    # reads would fill and block it).
    args += ["-q", str(workdir / "pgbouncer.ini")]
    try:
        process = _launch(args, workdir, port, timeout)
    except PgBouncerError:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return PgBouncer(port=port, dir=workdir, process=process, user=user,
                     upstream_port=upstream_port, pool_size=pool_size, args=args)


def _launch(args: list[str], workdir: Path, port: int,
            timeout: float) -> subprocess.Popen[bytes]:
    """Run ``args`` and wait until it listens on ``port``; PgBouncerError (the process
    killed) if it exits first or does not listen within ``timeout`` seconds."""
    with (workdir / "stderr.txt").open("ab") as stderr:
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr,
                                   start_new_session=True)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            stderr = (workdir / "stderr.txt").read_text(errors="replace")
            raise PgBouncerError(f"pgbouncer exited at start ({process.returncode}):\n"
                                 f"{stderr}\n{_log(workdir)}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            process.wait(timeout=15)
            raise PgBouncerError(f"pgbouncer did not listen on {port} in {timeout}s:\n"
                                 f"{_log(workdir)}")
        time.sleep(0.05)


def _log(workdir: Path) -> str:
    path = workdir / "pgbouncer.log"
    return path.read_text(errors="replace") if path.exists() else ""


@contextmanager
def running(**options: Any) -> Iterator[PgBouncer]:
    """A pgbouncer for the duration of the block (see ``start``)."""
    bouncer = start(**options)
    try:
        yield bouncer
    finally:
        bouncer.stop()


def admin(port: int, command: str, user: str = "postgres") -> list[dict[str, Any]]:
    """Run ``command`` on the admin console of the pgbouncer listening on ``port``
    (the ``pgbouncer`` database; simple query protocol only, hence the client cursor)."""
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=port, user=user, dbname="pgbouncer",
                         autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        cursor = conn.execute(command)
        if cursor.description is None:
            return []
        names = [column.name for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def environment(bouncer: PgBouncer) -> dict[str, str]:
    """What django_app/settings.py reads to connect through ``bouncer``."""
    return {"IDEM_PG_PORT": str(bouncer.port), "IDEM_PGBOUNCER": "1",
            "IDEM_PG_DIRECT_PORT": str(bouncer.upstream_port)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.services.pgbouncer",
        description="Run a command with a private PgBouncer (transaction mode) in front of "
                    "PostgreSQL; the command gets IDEM_PG_PORT and IDEM_PGBOUNCER=1.")
    parser.add_argument("--pool-size", type=int, default=POOL_SIZE)
    parser.add_argument("--upstream-port", type=int, default=5432)
    parser.add_argument("--pool-mode", default="transaction",
                        choices=("transaction", "session", "statement"))
    parser.add_argument("--ignore-startup-parameters", default="",
                        help="PgBouncer's setting of that name, e.g. 'options'")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command to run, after --")
    with running(pool_size=args.pool_size, upstream_port=args.upstream_port,
                 ignore_startup_parameters=args.ignore_startup_parameters,
                 pool_mode=args.pool_mode) as bouncer:
        print(f"pgbouncer on 127.0.0.1:{bouncer.port} ({args.pool_mode} mode, pool size "
              f"{bouncer.pool_size})",
              file=sys.stderr, flush=True)
        return subprocess.call(command, env={**os.environ, **environment(bouncer)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
