"""Plot the headline: throughput of each variant as a ratio to plain Celery, per broker.

    .venv/bin/python bench/plot.py [--input bench/results/throughput.json]
                                   [--output docs/benchmarks-throughput.png]

Bars are the median ratio over rounds, whiskers the smallest and largest round; the
dashed lines are the issue's targets (0.85 default mode, 0.95 atomic, 1.0 replay).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LABELS = {
    "plain": "plain Celery", "once": "celery-once", "idem": "IdempotentTask",
    "atomic": "IdempotentTask\natomic=True", "replay3": "each message\nsent 3 times",
    "replay": "replay of\nfinished keys",
}


def label(variant: str) -> str:
    name, _, conn = variant.partition(":")
    text = LABELS.get(name, name)
    return f"{text}\n[{conn}]" if conn else text


def plot(data: dict, output: Path, title: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = data["summary"]
    brokers = list(summary)
    variants: list[str] = []
    for b in brokers:
        for v in summary[b]:
            if v not in variants:
                variants.append(v)
    width = 0.8 / max(1, len(brokers))
    fig, ax = plt.subplots(figsize=(max(8, 1.5 * len(variants)), 5))
    for i, broker in enumerate(brokers):
        xs, ys, lo, hi, rates = [], [], [], [], []
        for j, v in enumerate(variants):
            e = summary[broker].get(v)
            if not e or "median_ratio" not in e:
                continue
            xs.append(j + (i - (len(brokers) - 1) / 2) * width)
            ys.append(e["median_ratio"])
            lo.append(e["median_ratio"] - e["min_ratio"])
            hi.append(e["max_ratio"] - e["median_ratio"])
            rates.append(e["median_msgs_per_s"])
        bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=broker)
        for bar, y, r in zip(bars, ys, rates, strict=True):
            ax.annotate(f"{y:.2f}\n{r:.0f}/s", (bar.get_x() + bar.get_width() / 2, y),
                        xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7)
    for y, text in ((1.0, "plain"), (0.95, "atomic target"), (0.85, "default target")):
        ax.axhline(y, color="grey", linestyle="--", linewidth=0.8)
        ax.annotate(text, (len(variants) - 0.5, y), fontsize=7, color="grey", va="bottom",
                    ha="right")
    ax.set_xticks(range(len(variants)), [label(v) for v in variants], fontsize=8)
    ax.set_ylabel("throughput / plain Celery in the same round")
    s = data.get("settings", {})
    env = data.get("environment", {})
    pk = env.get("packages", {})
    ax.set_title(title or (
        f"{s.get('n')} tasks/run, {s.get('rounds')} rounds, prefork -c {s.get('concurrency')},"
        f" acks_late, prefetch 1; Celery {pk.get('celery')}, PostgreSQL"
        f" {env.get('servers', {}).get('postgresql', '?').split()[0]},"
        f" {env.get('machine', {}).get('cores')} cores"), fontsize=9)
    ax.legend()
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", default=str(ROOT / "bench" / "results" / "throughput.json"))
    ap.add_argument("--output", default=str(ROOT / "docs" / "benchmarks-throughput.png"))
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    data = json.loads(Path(args.input).read_text())
    print(plot(data, Path(args.output), args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
