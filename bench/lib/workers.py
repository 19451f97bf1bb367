"""A benchmark's ``celery worker`` subprocess (prefork, the benchmark app) on one queue:
started, watched, measured (RSS from /proc) and stopped within a deadline. Apart from
bench/lib/common.py's environment and database helpers, which every benchmark uses, while
only the benchmarks with real workers start one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from bench.lib.common import MARK_URL, ROOT


class WorkerProcess:
    """A ``celery worker`` subprocess (prefork) on one queue, with the benchmark app."""

    def __init__(self, queue: str, concurrency: int = 2, conn: str = "fixup",
                 extra_env: dict[str, str] | None = None, loglevel: str = "WARNING") -> None:
        self.name = f"bench{uuid.uuid4().hex[:6]}"
        self.log_path = Path(os.environ["IDEM_VAR_DIR"]) / f"{self.name}.log"
        self.args = [
            sys.executable, "-m", "celery", "-A", "bench.lib.worker_app", "worker",
            "-P", "prefork", "-c", str(concurrency), "--prefetch-multiplier", "1",
            "-n", f"{self.name}@%h", "-Q", queue, "-l", loglevel,
            "--without-mingle", "--without-gossip", "--without-heartbeat",
        ]
        self.env = {**os.environ, "IDEM_QUEUE": queue, "BENCH_CONN": conn,
                    "BENCH_MARK_URL": MARK_URL, "PYTHONPATH": str(ROOT), **(extra_env or {})}
        self.queue = queue
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        log_file = self.log_path.open("ab")
        self.process = subprocess.Popen(self.args, env=self.env, cwd=ROOT, stdout=log_file,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def children(self) -> list[int]:
        assert self.process is not None
        try:
            text = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return []
        return [int(p) for p in text.split()]

    def rss_kib(self) -> dict[str, Any]:
        """Resident memory of the main process and each pool child, in KiB."""
        assert self.process is not None
        main = _rss(self.process.pid)
        kids = [_rss(p) for p in self.children()]
        return {"main": main, "children": kids, "total": main + sum(kids)}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> None:
        if not self.alive():
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0
