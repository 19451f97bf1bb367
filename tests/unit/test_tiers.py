"""tests/run.py's two lanes: the pytest runs at once never meet on a database, a queue or
a Redis database (tests/tiers.py); and the extras each tier installs."""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
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


def test_the_lanes_never_share_a_redis_database():
    streamed, beside = run.lanes(tiers.TIERS, serial=False)
    assert streamed and beside, "the tiers run in one lane"
    used_by_streamed = set().union(*(_redis_databases(t) for t in streamed))
    for tier in beside:
        assert not _redis_databases(tier) & used_by_streamed, tier.name


def test_each_tier_has_its_own_databases_queue_and_folder(tmp_path):
    """The lanes run at once on one PostgreSQL and one MariaDB server."""
    environments = [run.tier_environment(t, tmp_path, "0123abcd") for t in tiers.TIERS]
    for variable in ("IDEM_PG_NAME", "IDEM_MYSQL_NAME", "IDEM_QUEUE", "IDEM_VAR_DIR"):
        values = [env[variable] for env in environments]
        assert len(set(values)) == len(values), variable
    for env in environments:
        # An identifier both servers take unquoted, within their length limits.
        assert re.fullmatch(r"[a-z0-9_]{1,58}", env["IDEM_PG_NAME"]), env["IDEM_PG_NAME"]


def test_serial_runs_every_tier_in_one_lane_in_order():
    streamed, beside = run.lanes(tiers.TIERS, serial=True)
    assert (streamed, beside) == (tiers.TIERS, [])
    streamed, beside = run.lanes(tiers.TIERS, serial=False)
    assert sorted(streamed + beside, key=tiers.TIERS.index) == tiers.TIERS
    assert streamed == [t for t in tiers.TIERS if t in streamed]  # each lane keeps the order


def test_each_tier_installs_only_the_extras_it_needs():
    """The unit tests need ``test`` alone and the checks ``docs`` besides (both pure
    Python: no mysqlclient, which needs a C library and pkg-config); mysqlclient comes with
    the MariaDB tier that runs on it, beat, bench and docs with the tiers that run their
    tests (the browser tests open the built docs site)."""
    by_name = {t.name: t for t in tiers.TIERS}

    def extras_of(*names: str) -> set[str]:
        return set(run.extras([by_name[n] for n in names]).split(","))

    assert run.extras([]) == "test"
    assert run.extras([], checks=True) == "test,docs"
    assert extras_of("unit") == {"test"}
    assert extras_of("mariadb+redis") == {"test", "mysql", "beat"}
    assert extras_of("mariadb-pymysql") == {"test"}  # PyMySQL is in ``test``
    assert extras_of("postgres+redis") == {"test", "beat", "bench"}
    assert extras_of("unit", "sqlite", "mariadb+redis") == {"test", "beat", "mysql", "docs"}
    assert extras_of("oldest", "newest") == {"test"}  # their own venvs (tests/venvs.py)


def test_the_test_extra_builds_nothing_and_every_tier_extra_exists():
    project = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["project"]
    declared = project["optional-dependencies"]
    assert not [r for r in declared["test"] if r.lower().startswith("mysqlclient")]
    for tier in tiers.TIERS:
        assert set(tier.extras) <= set(declared), tier.name
