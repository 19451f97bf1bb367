"""Operating at scale: each operator action timed on a realistic job table of N rows.

    .venv/bin/python bench/scale.py                 # 10M jobs (~11 GB, ~5 min to build)
    .venv/bin/python bench/scale.py --rows 20000    # a quick look
    .venv/bin/python bench/scale.py --reuse         # time again on the table already built

The table lives in a database of its own (``IDEM_PG_NAME``, default ``idem_bench_scale``,
never the shared ``idem``), built with ``INSERT ... SELECT generate_series`` (secondary
indexes and constraints dropped for the load and built again after, then ``VACUUM
ANALYZE``): 2 history rows per job; 98 % SUCCEEDED, 1 % FAILED (a tenth of them
dead-lettered), 0.5 % RUNNING with expired leases, 0.5 % PENDING past the dispatch
timeout; 20 task names with a key prefix each (``order/``, ``invoice/``, ...), created
over 30 days in id order; a stored message (a real one, published through the
producer); plus ``--unknown`` (5,000) stale claims of a task no process knows.

Then each action, median of ``--repeat`` (3), through the library's own entry points:
the recovery pass (the first, which releases and re-sends the backlog to kombu's
in-memory broker, once, its clock moved back so the jobs it re-sends are between
re-sends afterwards: ``first_pass_lag``; then with only the unknown task's claims left;
then with nothing to do), ``idem_status`` (default and ``--exact``), every admin page
through Django's test client as a superuser (the list, each filter, the date ranges, the
sort orders, the searches, a page far down, a detail page), and ``idem_purge`` of the oldest day (rows/s) while a concurrent inserter
measures its worst insert latency. Writes bench/results/scale.json. ``--drop`` drops the
database afterwards (the JSON stays).

The table (its tasks, build and sizes) is bench/scale_table.py, the actions timed on it
bench/scale_actions.py; this module runs them and writes the results.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as c  # noqa: E402
from bench.run_environment import environment  # noqa: E402
from bench.scale_actions import admin_pages, purge, recovery, status  # noqa: E402
from bench.scale_table import build, register_tasks, table_sizes  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="jobs (default 10M)")
    ap.add_argument("--unknown", type=int, default=5000,
                    help="stale claims of a task no process knows (default 5,000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per action (median)")
    ap.add_argument("--purge-days", type=float, default=29.0,
                    help="idem_purge --older-than (default 29: the oldest day of 30)")
    ap.add_argument("--reuse", action="store_true",
                    help="time on the table already built (migrating it first)")
    ap.add_argument("--build-only", action="store_true", help="build, then stop")
    ap.add_argument("--drop", action="store_true", help="drop the database afterwards")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("IDEM_PG_NAME", "idem_bench_scale")
    c.configure_in_process(c.new_queue("bench-scale"))
    c.setup_django()
    register_tasks()
    try:
        built = table_sizes() if args.reuse else build(args.rows, args.unknown)
        c.log(f"table: {built['jobs']} jobs, {built['bytes_per_job']} bytes a job")
        if args.build_only:
            return 0
        data: dict[str, Any] = {
            "benchmark": "scale", "command": c.command_line(), "environment": environment(),
            "settings": vars(args), "table": built, "recovery": recovery(args.repeat)}
        c.log(f"recovery: {data['recovery']}")
        data["idem_status"] = status(args.repeat)
        c.log(f"idem_status: {data['idem_status']}")
        data["admin"] = admin_pages(args.repeat, built["jobs"])
        data["idem_purge"] = purge(args.purge_days)
        c.log(f"idem_purge: {data['idem_purge']}")
        data["table_after"] = table_sizes()
        data["loadavg_end"] = c.loadavg()
        c.write_result("scale", data, args.out)
    finally:
        if args.drop:
            c.drop_database(os.environ["IDEM_PG_NAME"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
