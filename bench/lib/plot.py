"""Figures (matplotlib, the ``bench`` extra): each variant's rate as a ratio to the plain
task of the same run, one bar per stack, whiskers the lowest and highest round.

    python -m bench plot                              # the baselines' rows
    python -m bench plot FILE... [--targets 0.8 0.85] # end-to-end results, one per stack
"""

from __future__ import annotations

import json
import statistics
import textwrap
from pathlib import Path
from typing import Any

from bench.lib import report


def draw(rows: list[tuple[str, dict[str, list[float]]]], legend: dict[str, str],
         output: Path, title: str, targets: tuple[float, ...] = ()) -> Path:
    """One group of bars per row (label, stack -> ratios per round), one bar per stack."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stacks = list(legend)
    width = 0.8 / max(1, len(stacks))
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(rows)), 5.5))
    for i, stack in enumerate(stacks):
        xs, ys, lo, hi = [], [], [], []
        for j, (_, by_stack) in enumerate(rows):
            values = by_stack.get(stack)
            if not values:
                continue
            median = statistics.median(values)
            xs.append(j + (i - (len(stacks) - 1) / 2) * width)
            ys.append(median)
            lo.append(median - min(values))
            hi.append(max(values) - median)
        bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=legend[stack])
        for bar, y in zip(bars, ys, strict=True):
            ax.annotate(f"{y:.2f}", (bar.get_x() + bar.get_width() / 2, y), xytext=(0, 3),
                        textcoords="offset points", ha="center", fontsize=7)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    for target in targets:
        ax.axhline(target, color="firebrick", linestyle=":", linewidth=0.9)
        ax.annotate(f"target {target:g}", (len(rows) - 0.5, target), xytext=(0, 2),
                    textcoords="offset points", ha="right", fontsize=7, color="firebrick")
    top = max([1.0, *(max(v) for _, by_stack in rows for v in by_stack.values() if v)])
    ax.set_ylim(0, top * 1.25)  # room for the legend above the bars
    ax.set_xticks(range(len(rows)), [textwrap.fill(label.replace("`", ""), 18, break_long_words=False)
                                     for label, _ in rows], fontsize=8)
    ax.set_ylabel("rate / the plain task's, same run")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def plot_baselines(baselines: list[dict[str, Any]], output: Path) -> Path:
    stacks = [b["stack"] for b in baselines]
    rows = [(label, dict(zip(stacks, cells, strict=True)))
            for label, cells in report.baseline_rows(baselines)]
    legend = {b["stack"]: f"{report.STACKS[b['stack']]} (plain {report.plain_rate(b):.0f}/s)"
              for b in baselines}
    return draw(rows, legend, output, "The committed baselines: each rate / the plain "
                "task's of the same run (Redis, prefork -c 2)")


def plot_stacks(paths: list[str], output: Path, broker: str | None = None,
                targets: tuple[float, ...] = ()) -> Path:
    files = [json.loads(Path(p).read_text()) for p in paths]
    broker = broker or files[0]["runs"][0]["broker"]
    by_variant = report.stack_ratios(files, broker)
    rows = [(report.LABELS.get(v) or f"publishing alone, {v.removeprefix('pub-')}",
             by_variant[v]) for v in report.COMPARED if v in by_variant]
    legend = {}
    for data in files:
        stack = report.database(data)
        plain = data["summary"].get(broker, {}).get("django", {}).get("median_total_per_s")
        legend[stack] = (f"{report.STACKS[stack]} (plain {plain:.0f}/s)" if plain
                         else report.STACKS[stack])
    s, env = files[0].get("settings", {}), files[0].get("environment", {})
    loads = [x for d in files for x in (d["environment"]["loadavg"][0], d["loadavg_end"][0])]
    title = (f"{broker}, {s.get('n')} tasks/run, {s.get('rounds')} rounds, prefork -c "
             f"{s.get('concurrency')}, policy {s.get('policy')}; Celery "
             f"{env.get('packages', {}).get('celery')}, {env.get('machine', {}).get('cores')} "
             f"cores, load {min(loads)}–{max(loads)}")
    return draw(rows, legend, output, title, targets)
