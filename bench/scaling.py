"""Scaling: claim+commit latency, a recovery pass and the admin at 10k, 100k and 1M jobs.

    .venv/bin/python bench/scaling.py --sizes 10000,100000,1000000

The job table grows in place (10k, then +90k, then +900k rows), bulk-loaded with
``generate_series`` (3 history lines per job, as a finished job has: published, claimed,
succeeded), then ``VACUUM ANALYZE``. At each size:

- ``claim+commit``: ``--ops`` fresh keys published through the producer, then claimed
  and committed through ``claims.acquire`` + ``Claim.succeed``; median of batches, in
  microseconds per key. Also the replay of an old, finished key (``claims.acquire`` on
  random bulk-loaded keys). ``EXPLAIN (ANALYZE, BUFFERS)`` of the claim statement shows
  which index it uses.
- ``recovery pass``: ``--stale`` bulk-loaded jobs turned into stale claims (RUNNING,
  lease expired), then one ``celery_idem.recovery.reap()`` pass, timed (it releases them and
  sends them again to a throwaway Redis queue, deleted afterwards); plus an idle pass
  with nothing to do, and the plans of the pass's queries.
- ``admin``: the job changelist (``/admin/celery_idem/job/``) rendered by Django's test
  client as a superuser: time and query count, unfiltered and filtered by state.

The table is bench/scaling_table.py; the measurements of a size are
bench/scaling_claims.py, bench/scaling_recovery.py and bench/scaling_admin.py (plans read
with bench/query_plan.py); this module runs them at each size and prints the table.
"""

from __future__ import annotations

import argparse
import random
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as c  # noqa: E402
from bench.run_environment import environment  # noqa: E402
from bench.scaling_admin import admin_changelist  # noqa: E402
from bench.scaling_claims import claim_latency, explain_claim  # noqa: E402
from bench.scaling_recovery import recovery  # noqa: E402
from bench.scaling_table import bulk_load, make_backlog, table_rows  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--ops", type=int, default=1000, help="claim+commit ops per size")
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--stale", type=int, default=1000)
    ap.add_argument("--backlog", type=int, default=100000,
                    help="at the largest size, also measure with this many PENDING jobs")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    queue = c.new_queue("bench-scaling")
    c.configure("redis", queue=queue)
    c.setup_django()
    import bench.worker_app  # noqa: F401

    env = environment()
    c.reset_tables()
    results = []
    tag = uuid.uuid4().hex[:6]
    loaded = 0
    try:
        for size in sizes:
            load_s = bulk_load(loaded, size, tag)
            loaded = size
            rng = random.Random(size)
            sample = [f"bench/{tag}-{g}" for g in rng.sample(range(size), min(size, max(
                args.stale, args.ops)))]
            c.log(f"size {size}: loaded in {load_s:.1f}s; table has {table_rows()} rows")
            r: dict[str, Any] = {"size": size, "rows": table_rows(), "load_s": round(load_s, 1)}
            r["claim"] = claim_latency(args.ops, args.batches, sample)
            r["claim_explain"] = explain_claim()
            r["recovery"] = recovery(args.stale, sample)
            r["admin"] = admin_changelist()
            r["loadavg"] = c.loadavg()
            results.append(r)
            c.log(f"size {size}: claim+commit {r['claim']['fresh_claim_commit_us']}us,"
                  f" replay {r['claim']['replay_claim_us']}us,"
                  f" claim uses {r['claim_explain']['indexes']},"
                  f" recovery {r['recovery'].get('stale_pass_ms')}ms"
                  f" ({r['recovery'].get('stale')} stale), idle {r['recovery'].get('idle_pass_ms')}ms,"
                  f" admin {({k: (v['ms'], v['queries']) for k, v in r['admin'].items() if isinstance(v, dict)})}")
        backlog: dict[str, Any] | None = None
        if args.backlog:
            pending = make_backlog(args.backlog, tag, loaded)
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("SELECT key FROM celery_idem_job WHERE state = 'SUCCEEDED'"
                               " AND key LIKE 'bench/' || %s || '-%%' ORDER BY random()"
                               " LIMIT %s", [tag, args.ops])
                sample = [k for (k,) in cursor.fetchall()]
            backlog = {"pending_jobs": pending, "rows": table_rows(),
                       "claim": claim_latency(args.ops, args.batches, sample),
                       "claim_explain": explain_claim()}
            c.log(f"backlog of {pending} PENDING jobs: claim+commit"
                  f" {backlog['claim']['fresh_claim_commit_us']}us, claim uses"
                  f" {backlog['claim_explain']['indexes']}"
                  f" ({backlog['claim_explain']['execution_ms']} ms execution)")
    finally:
        c.delete_queue("redis", queue)
    base = results[0]["claim"]["fresh_claim_commit_us"]
    data = {"benchmark": "scaling", "command": c.command_line(), "environment": env,
            "settings": vars(args), "results": results, "backlog": backlog,
            "claim_ratio_largest_to_smallest": round(
                results[-1]["claim"]["fresh_claim_commit_us"] / base, 3),
            "loadavg_end": c.loadavg()}
    c.write_result("scaling", data, args.out)
    print(f"\n{'rows':>9} {'claim+commit us':>16} {'replay us':>10} {'recovery ms':>12}"
          f" {'idle ms':>8} {'admin ms':>9} {'admin q':>8}")
    for r in results:
        adm = r["admin"].get("unfiltered", {}) if isinstance(r["admin"], dict) else {}
        print(f"{r['rows']:>9} {r['claim']['fresh_claim_commit_us']:>16}"
              f" {r['claim']['replay_claim_us']:>10} {r['recovery'].get('stale_pass_ms', '-')!s:>12}"
              f" {r['recovery'].get('idle_pass_ms', '-')!s:>8} {adm.get('ms', '-')!s:>9}"
              f" {adm.get('queries', '-')!s:>8}")
    print(f"claim+commit at {results[-1]['rows']} / at {results[0]['rows']}:"
          f" {data['claim_ratio_largest_to_smallest']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
