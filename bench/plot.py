"""Plot the headline: throughput of each variant as a ratio to plain Celery, per broker.

    .venv/bin/python bench/plot.py [--input bench/results/throughput.json]
                                   [--output docs/benchmarks-throughput.png]

Bars are the median ratio over rounds, whiskers the smallest and largest round; the
dashed lines are the issue's targets (0.85 default mode, 0.95 atomic, 1.0 replay).

    .venv/bin/python bench/plot.py --stacks bench/results/honest-stacks-{postgres,pgbouncer,mysql}.json \
                                   [--output docs/benchmarks-stacks.png] [--broker redis]

compares stacks instead: results files of ``bench/honest.py --database ...`` (one per
stack), each variant's rate as a ratio to the plain task of the same stack and round
(``report.stack_ratios``), one bar per stack; ``--targets 0.8,0.85`` draws those ratios
as dotted lines.
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


def plot_stacks(files: list[dict], output: Path, broker: str | None = None,
                title: str | None = None, targets: tuple[float, ...] = ()) -> Path:
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sys.path.insert(0, str(ROOT))
    from bench.report import COMPARED, LABELS, STACKS, database, stack_ratios

    broker = broker or files[0]["runs"][0]["broker"]
    by_variant = stack_ratios(files, broker)
    variants = [v for v in COMPARED if v in by_variant]
    stacks = [database(d) for d in files]
    width = 0.8 / max(1, len(stacks))
    fig, ax = plt.subplots(figsize=(max(8, 1.8 * len(variants)), 5))
    for i, (stack, data) in enumerate(zip(stacks, files, strict=True)):
        xs, ys, lo, hi = [], [], [], []
        for j, v in enumerate(variants):
            values = by_variant[v].get(stack)
            if not values:
                continue
            median = statistics.median(values)
            xs.append(j + (i - (len(stacks) - 1) / 2) * width)
            ys.append(median)
            lo.append(median - min(values))
            hi.append(max(values) - median)
        plain = data["summary"][broker]["django"]["median_total_per_s"] \
            if "django" in data["summary"].get(broker, {}) else None
        bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3,
                      label=f"{STACKS[stack]} (plain {plain:.0f}/s)" if plain else STACKS[stack])
        for bar, y in zip(bars, ys, strict=True):
            ax.annotate(f"{y:.2f}", (bar.get_x() + bar.get_width() / 2, y), xytext=(0, 3),
                        textcoords="offset points", ha="center", fontsize=7)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    for target in targets:
        ax.axhline(target, color="firebrick", linestyle=":", linewidth=0.9)
        ax.annotate(f"target {target:g}", (len(variants) - 0.5, target), xytext=(0, 2),
                    textcoords="offset points", ha="right", fontsize=7, color="firebrick")
    top = max([1.0, *(max(v) for by_stack in by_variant.values() for v in by_stack.values())])
    ax.set_ylim(0, top * 1.25)  # room for the legend above the bars
    ax.set_xticks(range(len(variants)),
                  [LABELS.get(v, v).replace("`", "").replace(", ", ",\n")
                   if not v.startswith("pub-") else f"publishing alone\n{v[4:]}"
                   for v in variants], fontsize=8)
    ax.set_ylabel("rate / the plain task's, same stack and round")
    s, env = files[0].get("settings", {}), files[0].get("environment", {})
    loads = [x for d in files for x in (d["environment"]["loadavg"][0], d["loadavg_end"][0])]
    ax.set_title(title or (
        f"{broker}, {s.get('n')} tasks/run, {s.get('rounds')} rounds, prefork -c "
        f"{s.get('concurrency')}, policy {s.get('policy')}; Celery "
        f"{env.get('packages', {}).get('celery')}, {env.get('machine', {}).get('cores')} "
        f"cores, load {min(loads)}–{max(loads)}"), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", default=str(ROOT / "bench" / "results" / "throughput.json"))
    ap.add_argument("--stacks", nargs="+", default=None, metavar="FILE",
                    help="results files of honest.py --database (one per stack): the "
                         "stacks' figure (default output docs/benchmarks-stacks.png)")
    ap.add_argument("--broker", default=None, help="with --stacks: the broker (default the "
                    "first file's first)")
    ap.add_argument("--targets", default="", help="with --stacks: ratios drawn as dotted "
                    "lines, e.g. 0.8,0.85 (issue 21's)")
    ap.add_argument("--output", default=None, help="default docs/benchmarks-throughput.png")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    if args.stacks:
        files = [json.loads(Path(f).read_text()) for f in args.stacks]
        print(plot_stacks(files, Path(args.output or ROOT / "docs" / "benchmarks-stacks.png"),
                          args.broker, args.title,
                          tuple(float(t) for t in args.targets.split(",") if t)))
        return 0
    data = json.loads(Path(args.input).read_text())
    print(plot(data, Path(args.output or ROOT / "docs" / "benchmarks-throughput.png"),
               args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
