"""tests/run.py's two lanes: the tiers run beside the PostgreSQL ones share no server with
them, so the two pytest runs at once never meet (tests/tiers.py)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from urllib.parse import urlparse

TESTS = Path(__file__).resolve().parents[1]
# The runner and its tiers are scripts of tests/, which import each other by bare name.
# tests/ leaves sys.path at once: its packaging/ folder would hide the ``packaging``
# library from whatever imports it later in this process (kombu's Redis transport).
sys.path.insert(0, str(TESTS))
try:
    run = importlib.import_module("run")
    tiers = importlib.import_module("tiers")
finally:
    sys.path.remove(str(TESTS))


def _redis_databases(tier) -> set[str]:
    """The Redis databases a tier's broker and results live in."""
    urls = (tier.env.get("IDEM_BROKER", ""), tier.env.get("IDEM_RESULTS", ""))
    return {urlparse(url).path for url in urls if url.startswith("redis://")}


def test_the_tiers_beside_never_use_postgresql_or_the_others_redis_databases():
    streamed, beside = run.lanes(tiers.TIERS, serial=False)
    assert beside, "no tier runs beside the PostgreSQL ones"
    for tier in beside:
        assert "postgres" not in tier.services and tier.server is None, tier.name
        assert tier.env.get("IDEM_DATABASE") in ("sqlite", "mysql"), tier.name
        assert tier.stack is None, tier.name  # the stack tiers are PostgreSQL's
    used_by_streamed = set().union(*(_redis_databases(t) for t in streamed))
    for tier in beside:
        assert not _redis_databases(tier) & used_by_streamed, tier.name


def test_serial_runs_every_tier_in_one_lane_in_order():
    streamed, beside = run.lanes(tiers.TIERS, serial=True)
    assert (streamed, beside) == (tiers.TIERS, [])
    streamed, beside = run.lanes(tiers.TIERS, serial=False)
    assert sorted(streamed + beside, key=tiers.TIERS.index) == tiers.TIERS
    assert streamed == [t for t in tiers.TIERS if t in streamed]  # each lane keeps the order
