"""What the chaos run must show after the drain, read from the job database, the fake
provider, the counter file and the fault log; and the Markdown table of it."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .faults import Fault


@dataclass
class Check:
    name: str
    value: int
    expected: str = "0"        # "0", or "-" for a figure that is only reported
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.expected == "-" or self.value == int(self.expected)


def _execution_explained(run: dict[str, Any], next_start: float, faults: list[Fault]) -> str:
    """The kind of a fault that hit this execution while it ran ('' if none did): it hit
    the execution's process (a kill or a freeze) after the execution started and before
    the key's next execution started; or it hit every process (a restart), and the time
    it lasted (until the database answered again) overlaps that span: an execution that
    started while the database was going down may not reach it for its commit."""
    # A fault aimed at this very process explains it better than a restart of a server.
    for fault in sorted(faults, key=lambda f: not f.pids):
        if run["t"] <= fault.end and fault.at <= next_start and (
                not fault.pids or run["pid"] in fault.pids):
            return fault.kind
    return ""


def counter_repeats(path: Path, keys: list[str], attempts: dict[str, int],
                    faults: list[Fault]) -> tuple[int, Counter[str], list[str], list[str]]:
    """(repeats, repeats per explaining fault kind, unexplained repeats, keys with no
    execution). A key's executions other than its committed attempt's are repeats; each
    must have been hit by a fault while it ran."""
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            run = json.loads(line)
            runs[run["key"]].append(run)
    repeats, by_kind, unexplained, missing = 0, Counter[str](), [], []
    for key in keys:
        mine = sorted(runs.get(key, []), key=lambda r: r["t"])
        if not mine:
            missing.append(key)
            continue
        committed = [r for r in mine if r["attempt"] == attempts.get(key)]
        if len(committed) != 1:
            unexplained.append(f"{key}: {len(committed)} executions of the committed attempt")
        for i, run in enumerate(mine):
            if run in committed[:1]:
                continue
            repeats += 1
            later = mine[i + 1]["t"] if i + 1 < len(mine) else float("inf")
            kind = _execution_explained(run, later, faults)
            if kind:
                by_kind[kind] += 1
            else:
                unexplained.append(f"{key}: attempt {run['attempt']} by pid {run['pid']}")
    return repeats, by_kind, unexplained, missing


def collect(published: dict[str, str], provider: Any, folder: Path,
            faults: list[Fault]) -> tuple[list[Check], dict[str, Any]]:
    """The checks, and the figures the report shows beside them."""
    from celery_idem.history import path_errors
    from celery_idem.models import Job, Transition
    from django_app.effects.chaos_tasks import COUNTER_FILE
    from django_app.effects.models import ChaosWrite

    jobs = {j.key: j for j in Job.objects.all()}
    lost = [k for k in published if k not in jobs or jobs[k].state != "SUCCEEDED"]
    stuck = [f"{j.key} {j.state}" for j in jobs.values() if j.state in ("RUNNING", "PENDING")]
    fenced_out = [f"{j.key}: result of attempt {(j.result or {}).get('attempt')}, job at "
                  f"{j.attempt}" for j in jobs.values()
                  if j.state == "SUCCEEDED" and (j.result or {}).get("attempt") != j.attempt]

    writes = Counter(ChaosWrite.objects.values_list("key", flat=True))
    atomic = [k for k, kind in published.items() if kind == "atomic"]
    atomic_bad = [f"{k}: {writes[k]} rows" for k in atomic if writes[k] != 1]
    charges = Counter(c["reference"] for c in provider.charges)
    charge_keys = [k for k, kind in published.items() if kind == "charge"]
    keyed_bad = [f"{k}: {charges[k]} charges" for k in charge_keys if charges[k] != 1]
    keyed_bad += [f"{ref}: a charge for no job" for ref in charges if ref not in published]

    lines: dict[int, list[tuple[str, str | None, str]]] = defaultdict(list)
    for job_id, event, source, target in Transition.objects.order_by("id").values_list(
            "job_id", "event", "from_state", "to_state"):
        lines[job_id].append((event, source, target))
    illegal = []
    for j in jobs.values():
        errors = path_errors(lines[j.id], j.state)
        if errors:
            path = " ".join(f"{e}({a or '-'}->{b})" for e, a, b in lines[j.id])
            illegal.append(f"{j.key} {j.state}: {errors[0]}; history: {path}")

    count_keys = [k for k, kind in published.items() if kind == "count"]
    repeats, by_kind, unexplained, missing = counter_repeats(
        folder / COUNTER_FILE, count_keys, {k: jobs[k].attempt for k in count_keys if k in jobs},
        faults)
    zombies = [f for f in faults if f.kind == "zombie"]
    zombie_won = [f"{f.detail['key']}: frozen attempt {f.detail['attempt']}" for f in zombies
                  if k_attempt(jobs, f) <= f.detail["attempt"] or not f.detail.get("taken_over")]
    recovery_events = ("taken_over", "released", "redispatched", "attempt_lost",
                       "late_finish", "retry_scheduled", "dead_lettered")
    events = Counter(Transition.objects.filter(event__in=recovery_events)
                     .values_list("event", flat=True))

    checks = [
        Check("jobs lost (published, not SUCCEEDED)", len(lost), examples=lost),
        Check("atomic effects not exactly once", len(atomic_bad), examples=atomic_bad),
        Check("keyed effects not exactly once at the provider", len(keyed_bad),
              examples=keyed_bad),
        Check("non-idempotent effects missing", len(missing), examples=missing),
        Check("non-idempotent repeats", repeats, "-",
              examples=[f"{kind}: {n}" for kind, n in sorted(by_kind.items())]),
        Check("non-idempotent repeats not matched to a fault", len(unexplained),
              examples=unexplained),
        Check("histories with an illegal transition", len(illegal), examples=illegal),
        Check("claims left RUNNING or PENDING after the drain", len(stuck), examples=stuck),
        Check("results from a fenced-out attempt", len(fenced_out), examples=fenced_out),
        Check("zombies whose late commit was not fenced out", len(zombie_won),
              examples=zombie_won),
    ]
    figures = {"jobs": len(published), "job rows": len(jobs),
               "events": {e: events[e] for e in recovery_events if events[e]},
               "charges at the provider": len(provider.charges),
               "provider requests": len(provider.requests), "atomic rows": sum(writes.values()),
               "repeats by fault": dict(by_kind)}
    return checks, figures


def k_attempt(jobs: dict[str, Any], fault: Fault) -> int:
    job = jobs.get(fault.detail["key"])
    return job.attempt if job is not None else 0


def markdown(title: dict[str, Any], checks: list[Check], faults: Counter[str]) -> str:
    """The report as Markdown: the run, then one row per check, then the faults."""
    out = ["| run | |", "| --- | --- |"]
    out += [f"| {name} | {value} |" for name, value in title.items()]
    out += ["", "| check | result | expected | |", "| --- | --- | --- | --- |"]
    for c in checks:
        verdict = "ok" if c.ok else "**FAILED**"
        shown = "; ".join(c.examples[:3]) if c.expected == "-" else verdict
        out.append(f"| {c.name} | {c.value} | {c.expected if c.expected != '-' else 'reported'}"
                   f" | {shown} |")
    out += ["", "| fault injected | count |", "| --- | --- |"]
    out += [f"| {kind} | {n} |" for kind, n in sorted(faults.items())]
    return "\n".join(out)
