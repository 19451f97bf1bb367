"""CPU per process group, from /proc: what bench/honest.py and bench/session_cost.py
charge each run's producer, workers, servers, pooler and broker."""

from __future__ import annotations

import os
from pathlib import Path

from bench.stacks import Stack, pids_named
from bench.worker_process import WorkerProcess

CLK = os.sysconf("SC_CLK_TCK")


def ticks(pid: int, children: bool = False) -> int:
    """utime + stime of ``pid`` (plus its reaped children's), in clock ticks; 0 if gone."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0
    total = int(rest[11]) + int(rest[12])
    return total + (int(rest[13]) + int(rest[14]) if children else 0)


class Groups:
    """CPU ticks of each process group, sampled before and after a run."""

    def __init__(self, broker: str, worker: WorkerProcess | None, stack: Stack) -> None:
        self.broker_pids = pids_named("redis-server") if broker == "redis" \
            else pids_named("beam.smp")
        self.worker = worker
        self.stack = stack

    def sample(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {
            group: {p: ticks(p) for p in pids}
            for group, pids in self.stack.server_groups().items()}
        out["broker"] = {p: ticks(p) for p in self.broker_pids}
        out["worker"] = {}
        if self.worker is not None and self.worker.process is not None:
            main = self.worker.process.pid
            out["worker"] = {main: ticks(main, children=True),
                             **{p: ticks(p) for p in self.worker.children()}}
        return out

    @staticmethod
    def delta(before: dict[str, dict[int, int]], after: dict[str, dict[int, int]],
              n: int) -> dict[str, float]:
        """µs of CPU per task per group (a process new since ``before`` counts from 0)."""
        per_task = {}
        for group, now in after.items():
            ticks_used = sum(t - before[group].get(p, 0) for p, t in now.items())
            per_task[group] = round(1e6 * ticks_used / CLK / n, 1)
        return per_task
