"""bench/honest.py's summary of its runs (medians and ratios per broker and variant, each
against the plain task, or plain publishing, of the same round) and its printed table."""

from __future__ import annotations

from typing import Any

from bench import _common as c
from bench.stacks import DB_GROUP


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    rounds: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for r in runs:
        rounds.setdefault((r["broker"], r["round"]), {})[r["variant"]] = r
    for (broker, _), by_variant in sorted(rounds.items()):
        for variant, r in by_variant.items():
            e = summary.setdefault(broker, {}).setdefault(variant, {
                "total_per_s": [], "publish_per_s": [], "worker_per_s": [],
                "ratio_to_django": [], "ratio_to_raw": [], "cpu": [], "wal": [], "wal_cluster": [],
                "sessions": []})
            rate = "publish_per_s" if variant.startswith("pub-") else "total_per_s"
            for key in ("total_per_s", "publish_per_s", "worker_per_s"):
                if r[key] is not None:
                    e[key].append(r[key])
            base = by_variant.get("pub-plain" if variant.startswith("pub-") else "django")
            if base and base[rate] and r[rate]:
                e["ratio_to_django"].append(round(r[rate] / base[rate], 3))
            if "raw" in by_variant and by_variant["raw"]["total_per_s"] and r["total_per_s"] \
                    and not variant.startswith("pub-"):
                e["ratio_to_raw"].append(round(r["total_per_s"] / by_variant["raw"]["total_per_s"], 3))
            e["cpu"].append(r["cpu_us_per_task"])
            for key, into in (("wal_bytes_per_task", "wal"), ("pg_sessions_per_task", "sessions"),
                              ("wal_bytes_per_task_cluster", "wal_cluster")):
                if r[key] is not None:  # None: not measured (MariaDB)
                    e[into].append(r[key])
    for variants in summary.values():
        for e in variants.values():
            for key in ("total_per_s", "publish_per_s", "worker_per_s", "ratio_to_django",
                        "ratio_to_raw", "wal", "wal_cluster", "sessions"):
                e[f"median_{key}"] = round(c.median(e[key]), 3) if e[key] else None
            groups = sorted({g for cpu in e["cpu"] for g in cpu})
            e["median_cpu_us"] = {g: round(c.median(cpu.get(g, 0) for cpu in e["cpu"]), 1)
                                  for g in groups}
            del e["cpu"]
    return summary


def print_table(data: dict[str, Any]) -> None:
    s = data["settings"]
    database = s.get("database", "postgres")  # files from before --database: PostgreSQL
    print(f"database={database} n={s['n']} rounds={s['rounds']} policy={s['policy']} "
          f"load {data['environment']['loadavg']} -> {data['loadavg_end']}")
    head = (f"  {'variant':10} {'total/s':>8} {'x django':>8} {'x raw':>6} {'publish/s':>9} "
            f"{'worker/s':>8} {'cpu prod':>8} {'worker':>7} {'db':>7} {'pooler':>7} "
            f"{'broker':>7} {'WAL B':>7} {'sess':>5}")
    db = DB_GROUP[database]
    for broker, variants in data["summary"].items():
        print(f"\n{database}, {broker} (medians; CPU µs ({db}; PgBouncer as pooler), WAL bytes"
              f" of this database and PostgreSQL sessions opened, per task; None: n/a)\n{head}")
        for name, e in variants.items():
            cpu = e["median_cpu_us"]
            print(f"  {name:10} {e['median_total_per_s']!s:>8} {e['median_ratio_to_django']!s:>8} "
                  f"{e['median_ratio_to_raw']!s:>6} {e['median_publish_per_s']!s:>9} "
                  f"{e['median_worker_per_s']!s:>8} {cpu.get('producer')!s:>8} "
                  f"{cpu.get('worker')!s:>7} {cpu.get(db)!s:>7} {cpu.get('pgbouncer')!s:>7} "
                  f"{cpu.get('broker')!s:>7} {e['median_wal']!s:>7} "
                  f"{e.get('median_sessions')!s:>5}")
