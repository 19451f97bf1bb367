"""The demo's Celery processes: workers (killed and replaced) and beat."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Kill:
    node: str
    at: float  # time.time() when the SIGKILL was sent


@dataclass
class Fleet:
    """Worker processes (``-P prefork -c concurrency``) and one beat, all logging to
    ``logs``; every process is the leader of its own process group, so a SIGKILL takes
    the pool children with it."""

    env: dict[str, str]
    cwd: Path
    logs: Path
    queues: str
    concurrency: int = 2
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    kills: list[Kill] = field(default_factory=list)
    beat: subprocess.Popen[bytes] | None = None
    _started: int = 0

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as log:
            return subprocess.Popen([sys.executable, "-m", "celery", "-A", "shop", *args],
                                    cwd=self.cwd, env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def start_worker(self) -> str:
        self._started += 1
        node = f"shop{self._started}@demo"
        self.workers[node] = self._spawn(f"shop{self._started}", [
            "worker", "-P", "prefork", "-c", str(self.concurrency), "-n", node,
            "-Q", self.queues, "-l", "INFO",
            "--without-mingle", "--without-gossip", "--without-heartbeat"])
        return node

    def start_beat(self) -> None:
        self.beat = self._spawn("beat", ["beat", "-l", "INFO", "--pidfile=",
                                         "-s", str(self.logs / "celerybeat-schedule")])

    def wait_ready(self, timeout: float = 120) -> None:
        """Until every worker has logged that it is ready (they start in parallel)."""
        deadline = time.monotonic() + timeout
        for node in self.alive():
            log = self.logs / f"{node.split('@')[0]}.log"
            while " ready." not in log.read_text(errors="replace"):
                if self.workers[node].poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"worker {node} did not start: see {log}")
                time.sleep(0.1)

    def alive(self) -> list[str]:
        return [node for node, p in self.workers.items() if p.poll() is None]

    def kill(self, node: str) -> None:
        """SIGKILL the whole worker: its main process and its pool children at once."""
        process = self.workers[node]
        os.killpg(process.pid, signal.SIGKILL)
        self.kills.append(Kill(node, time.time()))
        process.wait()

    def stop(self, report: Callable[[str], None] = lambda line: None) -> float:
        """Warm shutdown of everything (SIGTERM: running bodies finish), reporting how many
        processes are still stopping; returns the seconds it took."""
        started = time.monotonic()
        processes = [p for p in [*self.workers.values(), self.beat] if p and p.poll() is None]
        for p in processes:
            p.send_signal(signal.SIGTERM)
        deadline = started + 30
        while any(p.poll() is None for p in processes):
            waiting = sum(p.poll() is None for p in processes)
            report(f"warm shutdown: {len(processes) - waiting} of {len(processes)} processes "
                   f"stopped ({time.monotonic() - started:.1f} s)")
            if time.monotonic() > deadline:
                for p in processes:
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
            time.sleep(0.1)
        return time.monotonic() - started
