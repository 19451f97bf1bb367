"""The chaos suite's Celery processes: prefork workers (killed, frozen and replaced during
the run) and one ``celery beat`` running the recovery pass. Each is a process group of its
own, so a SIGKILL takes the pool children with it and teardown leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from .servers import wait_for

ROOT = Path(__file__).resolve().parents[2]


class Process:
    """One Celery process (worker or beat) in its own session, logging to ``log``."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.args, env=self.env, cwd=ROOT, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def children(self) -> list[int]:
        """The pool's child process ids."""
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return []
        return [int(p) for p in text.split()]

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Until the worker logs that it is ready (it consumes from now on)."""
        def ready() -> bool:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited at start; see {self.log}")
            return " ready." in self.log.read_text(errors="replace")
        wait_for(ready, timeout, f"{self.name} to be ready")

    def kill(self) -> None:
        """SIGKILL the whole process group: main process and pool children at once."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)

    def terminate(self) -> None:
        """Ask for a warm shutdown (SIGTERM; SIGCONT first, in case it is frozen)."""
        if self.alive():
            assert self.process is not None
            try:
                os.killpg(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> None:
        """Warm shutdown (``terminate``), then SIGKILL."""
        if self.alive():
            assert self.process is not None
            self.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # and any child the main process left behind


class Fleet:
    """``size`` prefork workers of ``concurrency`` children on ``queues``, and beat."""

    def __init__(self, folder: Path, env: dict[str, str], queues: list[str], size: int,
                 concurrency: int) -> None:
        self.folder = folder
        self.env = env
        self.queues = queues
        self.size = size
        self.concurrency = concurrency
        self.workers: list[Process] = []
        self.retired: list[Process] = []
        self.beat: Process | None = None
        self.lock = threading.Lock()
        self._started = 0

    def _worker(self) -> Process:
        self._started += 1
        name = f"chaos{self._started}"
        args = [sys.executable, "-m", "celery", "-A", "django_app", "worker", "-P", "prefork",
                "-c", str(self.concurrency), "-n", f"{name}@%h", "-Q", ",".join(self.queues),
                "-l", "INFO", "--without-mingle", "--without-gossip", "--without-heartbeat"]
        return Process(name, args, self.env, self.folder / f"{name}.log")

    def start(self) -> None:
        started = [self._worker().start() for _ in range(self.size)]
        with self.lock:
            self.workers.extend(started)
        for worker in started:
            worker.wait_ready()
        beat_env = {**self.env, "DJANGO_SETTINGS_MODULE": "tests.chaos.beat_settings"}
        self.beat = Process("beat", [
            sys.executable, "-m", "celery", "-A", "django_app", "beat", "-l", "INFO",
            "-s", str(self.folder / "beat-schedule"), "--pidfile", ""],
            beat_env, self.folder / "beat.log").start()

    def replace(self, dead: Process) -> Process:
        """Start a worker in place of ``dead`` (already killed) and wait until it is ready."""
        fresh = self._worker().start()
        with self.lock:
            self.workers.remove(dead)
            self.retired.append(dead)
            self.workers.append(fresh)
        fresh.wait_ready()
        return fresh

    def children(self) -> dict[int, Process]:
        """Every live pool child, with its worker."""
        with self.lock:
            workers = list(self.workers)
        return {child: w for w in workers for child in w.children()}

    def stop(self) -> None:
        """Warm shutdown of everything started; what does not stop is killed."""
        with self.lock:
            everything = [*self.workers, *self.retired]
        if self.beat is not None:
            self.beat.stop()
        for process in everything:  # all asked first, so they shut down together
            process.terminate()
        for process in everything:
            process.stop()
