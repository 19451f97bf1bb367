"""The chaos suite's own servers: a PostgreSQL cluster and a Redis, on ports of their own,
so that restarting them touches nothing shared. Each runs in its own process group. (Its
MariaDB and PgBouncer are the test tiers' own: tests/services/.)"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")
#: The job database on the run's own server.
DATABASE_NAME = "chaos"


def free_port(start: int) -> int:
    """The first port from ``start`` on which nothing listens on 127.0.0.1."""
    for port in range(start, start + 200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}..{start + 199}")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll ``predicate`` until it returns something truthy; raise after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


class Postgres:
    """A throw-away cluster (initdb in ``folder``), started with ``pg_ctl`` on ``port``.

    PostgreSQL refuses to run as root: as root, its commands run as the ``postgres`` user.
    """

    def __init__(self, folder: Path, port: int) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.port = port
        self.log = folder / "postgres.log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, start_new_session=True)

    def start(self) -> Postgres:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._as:
            user = pwd.getpwnam("postgres")
            os.chown(self.folder, user.pw_uid, user.pw_gid)
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "-A", "trust", "--no-sync", "-E", "UTF8")
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c full_page_writes=off -c max_connections=200")
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                  "-o", options, "-w", "-t", "60", "start")
        return self

    def restart(self) -> None:
        """Fast restart: every session is terminated, in-flight transactions roll back."""
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                  "-m", "fast", "-w", "-t", "60", "restart")

    def createdb(self, name: str) -> None:
        self._run(str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                  "-U", "postgres", name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run([*self._as, str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m",
                            "immediate", "-w", "-t", "60", "stop"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.folder, ignore_errors=True)


class Redis:
    """``redis-server`` without persistence: a restart loses every queued message."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder = folder
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Redis:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = (self.folder / "redis.log").open("ab")
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: listening(self.port), 30, f"redis-server on {self.port}")
        return self

    def crash(self) -> None:
        """SIGKILL: the queue, the unacked messages, everything in memory is gone."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def restart(self) -> None:
        self.crash()
        self.start()

    def stop(self) -> None:
        self.crash()
