"""The tables of docs/benchmarks.md, rendered from a results file of bench/honest.py.

    .venv/bin/python bench/report.py bench/results/honest-final.json

Medians of the rounds; in brackets the lowest and highest round. Ratios are taken per
round (to ``django`` for the worker variants, to ``pub-plain`` for publishing, to
``floor`` in its own column), then their median: so a drift between rounds cancels.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

LABELS = {
    "raw": "raw (psycopg, kept connection)", "django": "django (same task, `keep` policy)",
    "once": "celery-once", "floor": "floor (the protocol in raw SQL)",
    "idem": "`IdempotentTask`", "atomic": "`atomic=True`",
    "atomic1": "one-statement atomic (prototype)", "replay": "replay of finished keys",
}
PUBLISH = ("pub-plain", "pub-idem", "pub-async")


def _rounds(data: dict[str, Any], broker: str) -> dict[int, dict[str, dict[str, Any]]]:
    rounds: dict[int, dict[str, dict[str, Any]]] = {}
    for run in data["runs"]:
        if run["broker"] == broker:
            rounds.setdefault(run["round"], {})[run["variant"]] = run
    return rounds


def ratios(data: dict[str, Any], broker: str, variant: str, base: str) -> list[float]:
    """``variant``'s rate over ``base``'s, per round where both ran."""
    rate = "publish_per_s" if variant in PUBLISH else "total_per_s"
    return [runs[variant][rate] / runs[base][rate]
            for runs in _rounds(data, broker).values()
            if variant in runs and base in runs and runs[base][rate] and runs[variant][rate]]


def spread(values: list[float]) -> str:
    if not values:
        return ""
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:.2f}"
    return f"{median:.2f} ({min(values):.2f}–{max(values):.2f})"


def _n(value: Any) -> str:
    return "" if value is None else f"{value:,.0f}"


def table(data: dict[str, Any], broker: str) -> str:
    summary = data["summary"][broker]
    lines = [f"| {broker} | tasks/s | × django | × floor | CPU producer | CPU worker "
             "| CPU PostgreSQL | WAL B |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for variant, label in LABELS.items():
        e = summary.get(variant)
        if e is None:
            continue
        cpu = e["median_cpu_us"]
        to_django = "1.00" if variant == "django" else spread(
            ratios(data, broker, variant, "django"))
        to_floor = ("" if variant in ("raw", "django", "once") else "1.00"
                    if variant == "floor" else spread(ratios(data, broker, variant, "floor")))
        lines.append(f"| {label} | {_n(e['median_total_per_s'])} | {to_django} | {to_floor} "
                     f"| {_n(cpu.get('producer'))} | {_n(cpu.get('worker'))} "
                     f"| {_n(cpu.get('postgres'))} | {_n(e['median_wal'])} |")
    if all(v in summary for v in PUBLISH[:2]):
        rates = " / ".join(_n(summary[v]["median_publish_per_s"]) for v in PUBLISH
                           if v in summary)
        shown = [v for v in PUBLISH[1:] if v in summary]
        to_plain = " / ".join(spread(ratios(data, broker, v, "pub-plain")) for v in shown)
        cpu = " / ".join(_n(summary[v]["median_cpu_us"].get("producer")) for v in PUBLISH
                         if v in summary)
        pg = " / ".join(_n(summary[v]["median_cpu_us"].get("postgres")) for v in PUBLISH
                        if v in summary)
        wal = " / ".join(_n(summary[v]["median_wal"]) for v in PUBLISH if v in summary)
        names = " / ".join(v.removeprefix("pub-") for v in PUBLISH if v in summary)
        lines.append(f"| publishing alone: {names} | {rates} | {to_plain} | | {cpu} | "
                     f"| {pg} | {wal} |")
    return "\n".join(lines)


def markdown(data: dict[str, Any]) -> str:
    s = data["settings"]
    head = (f"{s['n']:,} tasks per run, {s['rounds']} rounds, policy `{s['policy']}`, load "
            f"average {data['environment']['loadavg'][0]} before and "
            f"{data['loadavg_end'][0]} after, {data['elapsed_s'] / 60:.0f} min.")
    brokers = dict.fromkeys(run["broker"] for run in data["runs"])  # in the order run
    return "\n\n".join([head, *(table(data, b) for b in brokers)])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print(markdown(json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
