"""A throw-away MariaDB server of its own (``mariadb-install-db`` into a temporary data
directory, ``mariadbd`` on a free port and a socket in that directory), so a test can
restart it without touching the shared one. Used by the chaos suite on MariaDB
(tests/chaos/run.py ``--database mariadb``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.chaos.servers import listening

INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"


def available() -> bool:
    return Path(INSTALL_DB).exists() and Path(MARIADBD).exists()


class MariaDB:
    """One ``mariadbd`` process, in its own process group, as root (``--user=root``).

    No grant tables: anyone on 127.0.0.1 connects as anyone, which a private server on
    loopback for one test run can afford. Durability is relaxed (the log is flushed once
    a second), which only matters for a crash of the machine, not of the server process.
    """

    def __init__(self, folder: Path, port: int) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.port = port
        self.socket = folder / "mariadb.sock"
        self.log = folder / "mariadb.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> MariaDB:
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self.data.exists():
            subprocess.run([INSTALL_DB, "--no-defaults", f"--datadir={self.data}",
                            "--user=root", "--auth-root-authentication-method=normal",
                            "--skip-test-db"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True)
        log = self.log.open("ab")
        self.process = subprocess.Popen(
            [MARIADBD, "--no-defaults", f"--datadir={self.data}", f"--port={self.port}",
             f"--socket={self.socket}", f"--pid-file={self.folder / 'mariadb.pid'}",
             "--bind-address=127.0.0.1", "--user=root", "--skip-grant-tables",
             "--skip-name-resolve", "--skip-log-bin", "--max-connections=300",
             "--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=2",
             "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not listening(self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"mariadbd exited at start:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"mariadbd did not listen on {self.port} in 60 s")
            time.sleep(0.1)
        return self

    def restart(self) -> None:
        """A normal shutdown (SIGTERM: every session is killed, in-flight transactions
        roll back), then a start on the same data."""
        self._signal(signal.SIGTERM)
        self.start()

    def createdb(self, name: str) -> None:
        import MySQLdb

        connection = MySQLdb.connect(host="127.0.0.1", port=self.port, user="root")
        try:
            connection.cursor().execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        finally:
            connection.close()

    def _signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)

    def stop(self) -> None:
        self._signal(signal.SIGKILL)
        shutil.rmtree(self.folder, ignore_errors=True)
