"""The summary: what happened, and each effect checked against exactly once."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from .processes import Kill
from .workload import STOCK, Workload

PREFIXES = ("charge", "confirm", "stock", "ship", "index")


@dataclass
class Check:
    name: str
    value: str
    ok: bool | None  # None: a figure, not a check


@dataclass
class Summary:
    lines: list[Check] = field(default_factory=list)

    def add(self, name: str, value: Any, ok: bool | None = None) -> None:
        self.lines.append(Check(name, str(value), ok))

    @property
    def passed(self) -> bool:
        return all(line.ok is not False for line in self.lines)


def repeats_without_crash(records: list[tuple[str, int, str, datetime]],
                          final_attempt: dict[str, int], kills: list[Kill]) -> list[str]:
    """Records (key, attempt, worker node, time) of a non-idempotent effect: every record
    beyond the one of the attempt that counts (``final_attempt``: the one that succeeded,
    or stored the step) must come from an attempt whose worker was SIGKILLed after the
    effect and before the next record. Returns what breaks that."""
    by_key: dict[str, list[tuple[int, str, datetime]]] = defaultdict(list)
    for key, attempt, node, at in records:
        by_key[key].append((attempt, node, at))
    bad = []
    for key, rows in by_key.items():
        rows.sort(key=lambda r: r[2])
        finals = [r for r in rows if r[0] == final_attempt.get(key)]
        if len(finals) != 1:
            bad.append(f"{key}: {len(finals)} records of the attempt that succeeded")
        for i, (attempt, node, at) in enumerate(rows):
            if attempt == final_attempt.get(key):
                continue
            until = rows[i + 1][2].timestamp() if i + 1 < len(rows) else float("inf")
            if not any(k.node == node and at.timestamp() <= k.at <= until for k in kills):
                bad.append(f"{key}: attempt {attempt} on {node} at {at:%H:%M:%S.%f} repeated "
                           "with no crash of its worker in between")
    return bad


def summarize(work: Workload, kills: list[Kill], events: Path, charges: list[dict[str, Any]],
              elapsed: float) -> tuple[Summary, list[str]]:
    """The summary lines, and the details of every failed check."""
    from shop import models as m

    from celery_idem.history import path_errors
    from celery_idem.models import Checkpoint, Job, Transition

    s, details = Summary(), []
    committed, refused = set(work.committed), set(work.refused)
    expected = {f"{p}/{o}" for o in committed for p in PREFIXES}
    jobs = {j.key: j for j in Job.objects.filter(task_name__startswith="shop.tasks.")}
    event_lines = Counter(line for f in events.glob("*.log") for line in f.read_text().split())
    delivered, waited = event_lines["delivered"], event_lines["waited"]
    bodies = sum(j.attempt for j in jobs.values())
    # A lost claim comes back released (the worker-lost hook, the recovery pass), taken
    # over past its lease by a duplicate, or as a lost attempt (an atomic body's claim
    # rolled back with it).
    released = Transition.objects.filter(
        event__in=["released", "taken_over", "attempt_lost"], job__key__in=list(jobs)).count()
    resent = Transition.objects.filter(event="redispatched", job__key__in=list(jobs)).count()

    s.add("orders committed", len(committed))
    # A rolled-back order left no row (SQLite may reuse its id for the next order, so
    # it is found by its customer) and no job: every job belongs to a committed order.
    s.add("orders rolled back (no trace)", len(refused),
          not m.Order.objects.filter(email__in=refused).exists() and set(jobs) <= expected)
    s.add("messages published by the shop", work.published)
    s.add("messages delivered to workers", delivered)
    s.add("bodies run (claims)", bodies)
    s.add("duplicates absorbed", max(0, delivered - bodies))
    s.add("  of which met a running attempt", waited)
    s.add("crashes (whole-worker SIGKILL)", len(kills))
    s.add("claims recovered / re-sent", f"{released} / {resent}")
    not_done = sorted(k for k in expected if k not in jobs or jobs[k].state != "SUCCEEDED")
    s.add("jobs succeeded", f"{len(expected) - len(not_done)} of {len(expected)}", not not_done)
    details += [f"not succeeded: {k} ({jobs[k].state if k in jobs else 'no job'})"
                for k in not_done[:10]]

    per_ref = Counter(c["reference"] for c in charges)
    wrong = [o for o in committed if per_ref[f"order-{o}"] != 1]
    wrong += [r for r in per_ref if int(r.split("-")[1]) not in committed]
    s.add("charges at the provider", len(charges), not wrong)
    details += [f"order {o}: {per_ref[f'order-{o}']} charges" for o in wrong[:10]]

    final = {k: j.attempt for k, j in jobs.items()}
    emails = [(e.key, e.attempt, e.worker, e.sent_at) for e in m.SentEmail.objects.all()]
    per_order = Counter(key for key, *_ in emails)
    bad = repeats_without_crash(emails, final, kills)
    missing = [o for o in committed if per_order[f"confirm/{o}"] < 1]
    s.add("e-mails, repeats matched to kills",
          f"{len(emails)} ({len(emails) - len(per_order)} repeats)", not bad and not missing)
    details += bad[:10] + [f"order {o}: no e-mail" for o in missing[:10]]

    deductions = Counter(m.StockDeduction.objects.values_list("order_id", flat=True))
    moved = sum(STOCK - p.quantity for p in m.Product.objects.all())
    total = sum(m.StockDeduction.objects.values_list("quantity", flat=True))
    ok = set(deductions) == committed and set(deductions.values()) <= {1} and moved == total
    s.add("stock deductions (atomic)", len(deductions), ok)

    shipments = m.Shipment.objects.all()
    writes = sum(x.writes for x in shipments)
    s.add("shipments (upserts run)", f"{len(shipments)} ({writes})",
          {x.order_id for x in shipments} == committed)

    checkpoints = Checkpoint.objects.filter(job__key__startswith="index/")
    steps = Counter(c.step for c in checkpoints)
    ocr = [(f"index/{r.order_id}", r.attempt, r.worker, r.at) for r in m.OcrRun.objects.all()]
    # The OCR run that counts is the one whose value was stored (its checkpoint's
    # attempt): a later attempt of the job got that value back without running OCR.
    stored = {c.job.key: c.attempt for c in checkpoints.select_related("job")
              if c.step == "ocr"}
    bad = repeats_without_crash(ocr, stored, kills)
    s.add("steps stored (ocr / index)", f"{steps['ocr']} / {steps['index']}",
          steps["ocr"] == steps["index"] == len(committed))
    s.add("OCR runs, repeats matched to kills", len(ocr),
          not bad and m.SearchEntry.objects.count() == len(committed))
    details += bad[:10]

    reports = list(m.TenantReport.objects.order_by("id"))
    tokens: dict[str, int] = {}
    fenced = True
    for r in reports:
        fenced &= r.token >= tokens.get(r.tenant, 0)
        tokens[r.tenant] = r.token
    s.add("coordinator writes in token order",
          f"{len(reports)} by {len({r.holder for r in reports})} workers", fenced and bool(reports))

    history: dict[int, list[tuple[str, str | None, str]]] = defaultdict(list)
    # In the order the rows were written (ids): ``at`` is stamped before a write waits
    # for its lock, so a duplicate's line can carry an earlier time than the success
    # it replayed.
    for t in Transition.objects.filter(job__key__in=list(jobs)).order_by("id"):
        history[t.job_id].append((t.event, t.from_state, t.to_state))
    illegal = {j.key: path_errors(history[j.pk], j.state) for j in jobs.values()}
    illegal = {k: e for k, e in illegal.items() if e}
    s.add("histories legal (path_errors)", f"{len(jobs) - len(illegal)} of {len(jobs)}",
          not illegal)
    details += [f"{k}: {e}" for k, e in list(illegal.items())[:10]]
    s.add("elapsed", f"{elapsed:.1f} s")
    s.add("throughput", f"{len(committed) / elapsed:.1f} orders/s, "
          f"{delivered / elapsed:.0f} messages/s")
    return s, details
