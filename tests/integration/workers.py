"""Real Celery worker processes for the integration tests: start, ping, kill, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def wait_until(predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.1,
               what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def purge_queue() -> int:
    """Drop what an earlier test left queued on this run's queue (a requeued or
    re-dispatched duplicate of a key it had finished), so it cannot run in this test."""
    from django_app.celery import app

    return app.control.purge()


def worker_env(**extra: str) -> dict[str, str]:
    """The environment a worker needs to share this test run's database and queue."""
    env = dict(os.environ)
    env.update({
        "DJANGO_SETTINGS_MODULE": "django_app.settings",
        "IDEM_DB_NAME": str(connection.settings_dict["NAME"]),
        "IDEM_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
        "IDEM_VAR_DIR": str(settings.VAR_DIR),
        "IDEM_BROKER": settings.CELERY_BROKER_URL,
        "IDEM_RESULTS": settings.CELERY_RESULT_BACKEND,
        "IDEM_DATABASE": settings.DATABASE_KIND,
        "PYTHONPATH": str(ROOT),
    })
    if connection.vendor == "postgresql":
        # The server, or the pooler in front of it (the pgbouncer tier): where this
        # process connects, so a worker's connections go the same way.
        env["IDEM_PG_PORT"] = str(connection.settings_dict["PORT"])
    env.update(extra)
    return env


#: Every pool the tests run workers with, and the concurrency each runs at.
POOL_CONCURRENCY = {"prefork": 2, "solo": 1, "threads": 4, "gevent": 8}


class Worker:
    """One ``celery worker`` OS process (prefork by default) on this run's queue."""

    def __init__(self, concurrency: int | None = None, pool: str = "prefork",
                 extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        if concurrency is None:
            concurrency = POOL_CONCURRENCY[pool]
        self.pool = pool
        self.name = f"w{uuid.uuid4().hex[:6]}"
        self.log_path = Path(settings.VAR_DIR) / f"{self.name}.log"
        self.args = [
            sys.executable, "-m", "celery", "-A", "django_app", "worker",
            "-P", pool, "-c", str(concurrency), "-n", f"{self.name}@%h",
            "-Q", settings.CELERY_TASK_DEFAULT_QUEUE, "-l", "INFO",
            "--without-mingle", "--without-gossip", "--without-heartbeat", *extra_args,
        ]
        self.env = env or worker_env()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90.0) -> Worker:
        from django_app.effects.tasks import ping

        log = self.log_path.open("ab")
        self.process = subprocess.Popen(self.args, env=self.env, cwd=ROOT, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        try:
            result = ping.apply_async()
            deadline = time.monotonic() + timeout
            while not result.ready():
                if self.process.poll() is not None:
                    raise AssertionError(f"worker exited at start:\n{self.log()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"worker did not answer a ping:\n{self.log()}")
                time.sleep(0.1)
        except BaseException:
            self.kill()  # no test owns it yet: never leave it running
            raise
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def children(self) -> list[int]:
        """The pool's child process ids."""
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except FileNotFoundError:
            return []
        return [int(p) for p in text.split()]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def assert_no_persistence_errors(self) -> None:
        """The job database never failed in this worker (a pool that shares a connection
        between threads fails here, then re-queues until the right thread takes it)."""
        bad = [line for line in self.log().splitlines() if "PersistenceError" in line]
        assert not bad, f"{self.pool} worker: the job database failed:\n" + "\n".join(bad[:5])

    def kill(self) -> None:
        """SIGKILL the whole worker: main process and pool children at once."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL if it does not exit in time."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
