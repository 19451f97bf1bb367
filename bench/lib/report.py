"""Tables: the baselines' (the performance page's) and an end-to-end results file's.

    python -m bench report                       # the baselines, ratios per stack
    python -m bench report --markdown --write docs/explanation/performance.md
    python -m bench report bench/results/end-to-end-postgres-*.json

The baselines' table: each row's rate as a ratio to the plain task of the same run (the
plain Django task on a kept connection, producer timed; plain publishing; plain Celery's
group for a batch), per stack. A results file's tables: medians of the rounds, CPU per
process group, WAL; with several files (one per stack), each file's tables, then one table
of every variant's ratio to the plain task per stack.

Medians of the rounds; in brackets the lowest and highest round. Ratios are taken per
round (to ``django``, the plain task, for the worker variants, to ``pub-plain`` for
publishing, to the floor of the variant's own shape in its own column), then their
median: so a drift between rounds cancels. The floor column: the modes that write an
intent at publish (``idem``, ``atomic``, ``replay``, the layout floors with an intent)
against ``floor-intent`` where the file has it; every other variant against
``floor-django`` (the floor of the same stack inside the same Django task), else
``floor``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench.lib.stacks import DB_GROUP

LABELS = {
    "raw": "raw (psycopg, kept connection)", "django": "django (same task, `keep` policy)",
    "once": "celery-once", "floor": "floor (the protocol in raw SQL)",
    "floor-django": "floor, in the Django task",
    "floor-intent": "floor with an intent at publish, in the Django task",
    "floor-bare": "floor on the least job table",
    "floor-bare-broker": "floor on the least job table, no intent",
    "floor-wide": "floor on today's job table",
    "floor-split": "floor on the split layout",
    "floor-split-hot": "floor on the split layout, HOT",
    "idem": "`IdempotentTask`", "atomic": "`atomic=True`",
    "replay": "replay of finished keys (answered at publish)",
    "replay-sent": "replay of finished keys, message sent",
    "idem-broker": "`IdempotentTask`, durability `broker`",
    "atomic-broker": "`atomic=True`, durability `broker`",
    "optimistic": "`atomic=\"optimistic\"`, durability `broker`",
}
#: The stacks of ``--stack`` (a file from before the option: PostgreSQL).
STACKS = {"postgres": "PostgreSQL", "pgbouncer": "PostgreSQL behind PgBouncer",
          "mysql": "MariaDB"}
PUBLISH = ("pub-plain", "pub-idem", "pub-async", "pub-broker", "pub-floor")
#: The variants that write an intent at publish: their floor is ``floor-intent``.
WITH_INTENT = ("idem", "atomic", "replay", "replay-sent", "floor-bare", "floor-wide",
               "floor-split", "floor-split-hot")


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


def database(data: dict[str, Any]) -> str:
    return str(data["settings"].get("database", "postgres"))


def table(data: dict[str, Any], broker: str, titled: bool = False) -> str:
    summary = data["summary"][broker]
    stack = database(data)
    group = DB_GROUP[stack]
    pooler = stack == "pgbouncer"
    title = f"{STACKS[stack]}, {broker}" if titled else broker
    lines = [f"| {title} | tasks/s | × django | × floor | CPU producer | CPU worker "
             f"| CPU {STACKS[stack].split()[0]} |{' CPU PgBouncer |' if pooler else ''} WAL B |",
             "| --- " * (9 if pooler else 8) + "|"]
    for variant, label in LABELS.items():
        e = summary.get(variant)
        if e is None:
            continue
        cpu = e["median_cpu_us"]
        to_django = "1.00" if variant == "django" else spread(
            ratios(data, broker, variant, "django"))
        floor = floor_of(variant, summary)
        to_floor = ("" if variant in ("raw", "django", "once") else "1.00"
                    if variant == floor else spread(ratios(data, broker, variant, floor)))
        lines.append(f"| {label} | {_n(e['median_total_per_s'])} | {to_django} | {to_floor} "
                     f"| {_n(cpu.get('producer'))} | {_n(cpu.get('worker'))} "
                     f"| {_n(cpu.get(group))} |{_pooler(cpu, pooler)} {_wal(e, stack)} |")
    if all(v in summary for v in PUBLISH[:2]):
        rates = " / ".join(_n(summary[v]["median_publish_per_s"]) for v in PUBLISH
                           if v in summary)
        shown = [v for v in PUBLISH[1:] if v in summary]
        to_plain = " / ".join(spread(ratios(data, broker, v, "pub-plain")) for v in shown)
        cpu = " / ".join(_n(summary[v]["median_cpu_us"].get("producer")) for v in PUBLISH
                         if v in summary)
        pg = " / ".join(_n(summary[v]["median_cpu_us"].get(group)) for v in PUBLISH
                        if v in summary)
        bouncer = " / ".join(_n(summary[v]["median_cpu_us"].get("pgbouncer")) for v in PUBLISH
                             if v in summary)
        wal = " / ".join(_wal(summary[v], stack) for v in PUBLISH if v in summary)
        names = " / ".join(v.removeprefix("pub-") for v in PUBLISH if v in summary)
        lines.append(f"| publishing alone: {names} | {rates} | {to_plain} | | {cpu} | "
                     f"| {pg} |{f' {bouncer} |' if pooler else ''} {wal} |")
    return "\n".join(lines)


def floor_of(variant: str, summary: dict[str, Any]) -> str:
    """The floor of ``variant``'s own shape that the results have (module docstring)."""
    if variant in WITH_INTENT and "floor-intent" in summary:
        return "floor-intent"
    return "floor-django" if "floor-django" in summary else "floor"


def _pooler(cpu: dict[str, Any], shown: bool) -> str:
    return f" {_n(cpu.get('pgbouncer'))} |" if shown else ""


def _wal(e: dict[str, Any], stack: str) -> str:
    return "n/a" if stack == "mysql" else _n(e["median_wal"])


#: The variants compared across stacks, and the baseline of each.
COMPARED = {"floor-django": "django", "floor-intent": "django", "floor-bare": "django",
            "floor-bare-broker": "django", "floor-wide": "django", "floor-split": "django",
            "floor-split-hot": "django", "idem": "django",
            "atomic": "django", "replay": "django", "replay-sent": "django", "idem-broker": "django",
            "atomic-broker": "django", "optimistic": "django", "once": "django",
            "pub-idem": "pub-plain", "pub-broker": "pub-plain", "pub-floor": "pub-plain"}


def stack_ratios(files: list[dict[str, Any]], broker: str) -> dict[str, dict[str, list[float]]]:
    """variant -> stack -> its ratios to the plain task (or plain publishing), per round."""
    out: dict[str, dict[str, list[float]]] = {}
    for variant, base in COMPARED.items():
        for data in files:
            values = ratios(data, broker, variant, base)
            if values:
                out.setdefault(variant, {})[database(data)] = values
    return out


def stacks_table(files: list[dict[str, Any]], broker: str) -> str:
    """Each variant's rate over the plain task's of the same round, per stack."""
    stacks = [database(d) for d in files]
    lines = [f"| {broker}: × plain, same stack and round | "
             + " | ".join(STACKS[s] for s in stacks) + " |",
             "| --- " * (1 + len(stacks)) + "|"]
    for base, rate, label in (("django", "median_total_per_s", "plain task, tasks/s"),
                              ("pub-plain", "median_publish_per_s",
                               "plain publishing, messages/s")):
        plain = [_n(d["summary"].get(broker, {}).get(base, {}).get(rate)) for d in files]
        if any(plain):
            lines.append(f"| {label} | " + " | ".join(plain) + " |")
    for variant, by_stack in stack_ratios(files, broker).items():
        label = LABELS.get(variant) or f"publishing alone: {variant.removeprefix('pub-')}"
        lines.append(f"| {label} | "
                     + " | ".join(spread(by_stack.get(s, [])) for s in stacks) + " |")
    return "\n".join(lines)


def markdown(data: dict[str, Any], titled: bool = False) -> str:
    s = data["settings"]
    stack = database(data)
    head = (f"{s['n']:,} tasks per run, {s['rounds']} rounds, policy `{s['policy']}`, load "
            f"average {data['environment']['loadavg'][0]} before and "
            f"{data['loadavg_end'][0]} after, {data['elapsed_s'] / 60:.0f} min.")
    if titled or stack != "postgres":
        head = f"**{STACKS[stack]}**: {head}"
    brokers = dict.fromkeys(run["broker"] for run in data["runs"])  # in the order run
    return "\n\n".join([head, *(table(data, b, titled or stack != "postgres")
                                for b in brokers)])


#: The rows of the baselines' table: (suite, variant, baseline variant, label).
BASELINE_ROWS = (
    ("end-to-end", "idem", "django", "a fresh task (`IdempotentTask`)"),
    ("end-to-end", "atomic", "django", "a fresh task, `atomic=True`"),
    ("end-to-end", "idem-broker", "django", "a fresh task, durability `broker`"),
    ("end-to-end", "atomic-broker", "django", "a fresh task, `atomic=True`, durability `broker`"),
    ("end-to-end", "optimistic", "django",
     "a fresh task, `atomic=\"optimistic\"`, durability `broker`"),
    ("end-to-end", "replay", "django", "a finished key published again (answered at publish)"),
    ("end-to-end", "replay-sent", "django", "a finished key's message run again"),
    ("end-to-end", "floor-bare", "django",
     "floor: the least job table's statements in raw SQL"),
    ("end-to-end", "pub-idem", "pub-plain", "publishing one at a time"),
    ("end-to-end", "pub-broker", "pub-plain", "publishing one at a time, durability `broker`"),
    ("publishing", "batch in atomic()", "plain group", "a batch of 1,000 in `atomic()`"),
    ("publishing", "batch: publish_many(group)", "plain group",
     "a batch of 1,000, `publish_many(group)`"),
)
#: The page whose table ``--write`` regenerates, between these markers.
MARKERS = ("<!-- bench:table:start -->", "<!-- bench:table:end -->")


def baseline_ratios(baseline: dict[str, Any], suite: str, variant: str,
                    base: str) -> list[float]:
    """``variant``'s ratios to ``base`` per round, from the first result of the baseline
    where both ran (each ratio within one run)."""
    for data in baseline["results"]:
        if data["suite"] != suite:
            continue
        if suite == "publishing":
            entry = data["results"].get(variant)
            if entry:
                return list(entry["rate_ratio_by_round"])
            continue
        for broker in data["summary"]:
            if variant in data["summary"][broker] and base in data["summary"][broker]:
                return ratios(data, broker, variant, base)
    return []


def plain_rate(baseline: dict[str, Any]) -> float | None:
    """The plain task's rate (tasks/s) in the first end-to-end result of the baseline."""
    for data in baseline["results"]:
        for by_variant in data.get("summary", {}).values() if data["suite"] == "end-to-end" \
                else ():
            if "django" in by_variant:
                return float(by_variant["django"]["median_total_per_s"])
    return None


def baseline_rows(baselines: list[dict[str, Any]]) -> list[tuple[str, list[list[float]]]]:
    """(label, each stack's ratios per round) for every row some stack has."""
    rows = []
    for suite, variant, base, label in BASELINE_ROWS:
        cells = [baseline_ratios(b, suite, variant, base) for b in baselines]
        if any(cells):
            rows.append((label, cells))
    return rows


def baseline_table(baselines: list[dict[str, Any]]) -> str:
    """The performance page's table: each row's rate as a ratio to the plain task (or plain
    publishing, or plain Celery's group) of the same run, median (lowest–highest round)."""
    stacks = [STACKS[b["stack"]] for b in baselines]
    lines = ["| × the plain task, same run | " + " | ".join(stacks) + " |",
             "| --- " * (1 + len(stacks)) + "|",
             "| the plain task, tasks/s | "
             + " | ".join(_n(plain_rate(b)) for b in baselines) + " |"]
    lines += [f"| {label} | " + " | ".join(spread(c) or "–" for c in cells) + " |"
              for label, cells in baseline_rows(baselines)]
    dates = sorted(r["environment"]["when"][:10] for b in baselines for r in b["results"])
    return "\n".join(lines) + (
        "\n\nEach ratio is the median of the rounds of one run (lowest–highest round in "
        "brackets), Redis as the broker, a prefork worker of 2 processes; the runs, of "
        f"{dates[0]} to {dates[-1]}, are listed in `bench/baselines/<stack>.json`.")


def write_between_markers(page: Path, block: str) -> None:
    """Replace what stands between the page's markers by ``block``."""
    text = page.read_text()
    start, end = (text.index(m) for m in MARKERS)
    page.write_text(text[:start + len(MARKERS[0])] + "\n" + block + "\n" + text[end:])


def between_markers(page: Path) -> str:
    text = page.read_text()
    start, end = (text.index(m) for m in MARKERS)
    return text[start + len(MARKERS[0]):end].strip("\n")


def files_report(paths: list[str]) -> str:
    """The tables of end-to-end results files; with several (one per stack), each file's
    tables, then every variant's ratio to the plain task per stack."""
    files = [json.loads(Path(arg).read_text()) for arg in paths]
    for path, data in zip(paths, files, strict=True):
        if data.get("suite", "end-to-end") != "end-to-end":
            raise SystemExit(f"{path}: a {data['suite']} results file; report FILE reads "
                             "end-to-end results (the others print their table when run)")
    parts = [markdown(data, titled=len(files) > 1) for data in files]
    if len(files) > 1:
        brokers = dict.fromkeys(run["broker"] for data in files for run in data["runs"])
        parts += [stacks_table(files, b) for b in brokers]
    return "\n\n".join(parts)
