"""The ``celery-compat`` tier: Celery's own integration suite, plain and with
``IdempotentTask`` as every task's base once per key kind (tests/compat/suite.py), each
run's outcome per test the plain run's except where tests/compat/allowed.toml says why.

The result file (every run's outcome per test) is written to ``IDEM_COMPAT_RESULTS``
(default ``celery-suite/results.json`` under ``IDEM_VAR_DIR``), beside each run's log and
junit xml. docs/explanation/celery-compatibility.md is generated from
tests/compat/results.json, the whole suite's result file (``--full``):
``IDEM_COMPAT_RESULTS=$PWD/tests/compat/results.json python3 tests/run.py --tier
celery-compat --full``, then ``.venv/bin/python tests/compat/report.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import celery
import pytest

from tests.compat import suite
from tests.compat.compare import Outcomes, judge, load_allowed
from tests.conftest import require_service

FULL = os.environ.get("IDEM_FULL_MATRIX") == "1"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcomes]:
    """Every run's outcome per test, written to the result file."""
    require_service("redis")
    require_service("postgres")
    cache = Path(os.environ.get("IDEM_COMPAT_CACHE", Path.home() / ".cache" / "celery-idem"))
    var = Path(os.environ.get("IDEM_VAR_DIR", tmp_path_factory.getbasetemp()))
    workdir = var / "celery-suite"
    workdir.mkdir(parents=True, exist_ok=True)
    found = suite.run_all(suite.sdist(celery.__version__, cache), workdir,
                          suite.Selection.load(FULL))
    results = Path(os.environ.get("IDEM_COMPAT_RESULTS", workdir / "results.json"))
    results.write_text(json.dumps({
        "celery": celery.__version__, "selection": "full" if FULL else "CI",
        "runs": found}, indent=1, sort_keys=True) + "\n")
    print(f"result file: {results}; logs in {workdir}")
    return found


def test_plain_celery_passes_its_own_suite(runs: dict[str, Outcomes]) -> None:
    """The comparison means something only if the plain run ran."""
    assert list(runs["plain"].values()).count("passed") > len(runs["plain"]) // 2, runs["plain"]


@pytest.mark.parametrize("kind", [name for name, kind in suite.RUNS.items() if kind])
def test_outcomes_match_plain_celery_but_for_the_allow_list(
        runs: dict[str, Outcomes], kind: str) -> None:
    verdict = judge({"plain": runs["plain"], kind: runs[kind]}, load_allowed())
    assert verdict.ok, f"Celery's suite with {kind} keys:\n{verdict}"
