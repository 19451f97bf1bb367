"""``EXPLAIN (ANALYZE, BUFFERS)`` of one statement, rolled back, and what its plan uses
(indexes, sequential scans, planning and execution time): bench/scaling.py's claim and
recovery measurements both read plans, so the reading is in one place.
"""

from __future__ import annotations

from typing import Any


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
