"""What the suites read beside their timings: CPU per process group, from /proc (what the
end-to-end suite charges each run's producer, workers, servers, pooler and broker), and
``EXPLAIN (ANALYZE, BUFFERS)`` of one statement, rolled back, with what its plan uses
(the scaling suite's claim and recovery plans)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.lib.stacks import Stack, pids_named
from bench.lib.workers import WorkerProcess

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


def explain(sql: str, params: Any) -> dict[str, Any]:
    from django.db import connection, transaction

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, SUMMARY) " + sql, params)
            lines = [r[0] for r in cursor.fetchall()]
        transaction.set_rollback(True)
    return _plan_summary(lines)


def _plan_summary(lines: list[str]) -> dict[str, Any]:
    import re

    indexes = sorted({m.group(1) for line in lines
                      for m in re.finditer(r"Index(?: Only)? Scan(?: Backward)? using (\S+)", line)})
    seq = sorted({m.group(1) for line in lines for m in re.finditer(r"Seq Scan on (\S+)", line)})
    bitmap = sorted({m.group(1) for line in lines
                     for m in re.finditer(r"Bitmap Index Scan on (\S+)", line)})

    def ms(label: str) -> float | None:
        for line in lines:
            if line.strip().startswith(label):
                return float(line.split(":")[1].split()[0])
        return None

    return {"indexes": indexes, "bitmap_indexes": bitmap, "seq_scans": seq,
            "planning_ms": ms("Planning Time"), "execution_ms": ms("Execution Time"),
            "plan": lines}
