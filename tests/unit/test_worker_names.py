"""A claim's worker id names its Celery node, its run (where the worker beats) and its pool
process; ``liveness.node_of`` reads the node back (the demo and operators' tools use it)."""

from __future__ import annotations

from celery_idem import liveness
from celery_idem.claims import worker_id


def test_node_of_reads_the_node_from_a_claim_of_a_beating_worker(monkeypatch):
    monkeypatch.setattr(liveness, "_run", "3f9a")
    claim = worker_id("shop1@demo", 4711)
    assert claim == "shop1@demo#3f9a/4711"
    assert liveness.node_of(claim) == "shop1@demo"


def test_node_of_reads_the_node_from_a_claim_without_a_run(monkeypatch):
    monkeypatch.setattr(liveness, "_run", None)
    assert liveness.node_of(worker_id("shop1@demo", 4711)) == "shop1@demo"
