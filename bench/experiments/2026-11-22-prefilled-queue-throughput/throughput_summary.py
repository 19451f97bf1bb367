"""bench/throughput.py's summary of its runs (each variant's rate per round, as a ratio to
the baseline variant's of the same round; medians and ranges per broker) and its printed
table."""

from __future__ import annotations

from typing import Any

from bench import _common as c


def summarize(runs: list[dict[str, Any]], baseline: str) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    by_round: dict[tuple[str, int], dict[str, float]] = {}
    for r in runs:
        label = r["variant"] if r["conn"] == "fixup" else f"{r['variant']}:{r['conn']}"
        by_round.setdefault((r["broker"], r["round"]), {})[label] = r["msgs_per_s"]
    for (broker, _), rates in sorted(by_round.items()):
        base = rates.get(baseline)
        for label, rate in rates.items():
            entry = summary.setdefault(broker, {}).setdefault(
                label, {"msgs_per_s": [], "ratio_to_plain": []})
            entry["msgs_per_s"].append(rate)
            if base:
                entry["ratio_to_plain"].append(round(rate / base, 3))
    for variants in summary.values():
        for entry in variants.values():
            entry["median_msgs_per_s"] = round(c.median(entry["msgs_per_s"]), 1)
            if entry["ratio_to_plain"]:
                entry["median_ratio"] = round(c.median(entry["ratio_to_plain"]), 3)
                entry["min_ratio"] = min(entry["ratio_to_plain"])
                entry["max_ratio"] = max(entry["ratio_to_plain"])
    return summary



def print_summary(summary: dict[str, Any]) -> None:
    for broker, variants in summary.items():
        print(f"\n{broker}")
        print(f"  {'variant':20} {'median msg/s':>12} {'ratio':>7} {'(min-max)':>13}")
        for label, e in variants.items():
            ratio = e.get("median_ratio")
            rng = f"{e.get('min_ratio')}-{e.get('max_ratio')}" if ratio is not None else ""
            print(f"  {label:20} {e['median_msgs_per_s']:>12} {ratio!s:>7} {rng:>13}")
