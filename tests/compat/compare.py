"""The outcome of each of Celery's tests per run, and what may differ from plain Celery.

Standard library only (tests/unit tests it without any service). A test's id is its
module and name as pytest reports them in the junit xml, e.g.
``test_canvas::test_chord::test_simple_chord``. An outcome is ``passed``, ``failed``
(a failure or an error), ``skipped`` (an xfail included) or, when a run did not report a
test that the plain run did, ``missing``.
"""

from __future__ import annotations

import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

#: test id -> outcome, for one run.
Outcomes = dict[str, str]
ALLOWED = Path(__file__).resolve().parent / "allowed.toml"
VERDICTS = ("difference", "unsupported")


def case_id(classname: str, name: str) -> str:
    """``t.integration.test_canvas.test_chord``, ``test_x``: ``test_canvas::test_chord::test_x``."""
    return "::".join([*classname.removeprefix("t.integration.").split("."), name])


def outcomes(junit: Path) -> Outcomes:
    """Each test's outcome in a junit xml file (none if the run wrote none)."""
    if not junit.exists():
        return {}
    found: Outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        found[case_id(case.get("classname", ""), case.get("name", ""))] = outcome
    return found


def node_id(case: str) -> str:
    """A test id as pytest names the test: ``t/integration/test_canvas.py::test_chord::...``."""
    module, rest = case.split("::", 1)
    return f"t/integration/{module}.py::{rest}"


@dataclass(frozen=True)
class Allowed:
    """One test allowed to differ from plain Celery in some runs, and why."""

    test: str
    runs: tuple[str, ...]
    verdict: str
    reason: str


def load_allowed(path: Path = ALLOWED) -> dict[tuple[str, str], Allowed]:
    """The allow-list by (test, run); a malformed entry raises ValueError naming it. An
    entry names one ``test``, or several ``tests`` that differ for one reason."""
    table: dict[tuple[str, str], Allowed] = {}
    for raw in tomllib.loads(path.read_text()).get("allowed", []):
        for test in raw["tests"] if "tests" in raw else [raw["test"]]:
            entry = Allowed(test, tuple(raw["runs"]), raw.get("verdict", "difference"),
                            raw["reason"].strip())
            if entry.verdict not in VERDICTS or not entry.reason:
                raise ValueError(f"{path}: {entry.test}: verdict must be one of {VERDICTS} "
                                 "and the reason must be given")
            for run in entry.runs:
                if (entry.test, run) in table:
                    raise ValueError(f"{path}: {entry.test} is listed twice for run {run}")
                table[entry.test, run] = entry
    return table


@dataclass(frozen=True)
class Difference:
    test: str
    run: str
    plain: str
    outcome: str

    def __str__(self) -> str:
        return f"{self.run}: {self.test}: {self.plain} plain, {self.outcome} here"


def differences(plain: Outcomes, run: str, other: Outcomes) -> list[Difference]:
    """The tests of the plain run whose outcome differs in ``other``."""
    return [Difference(test, run, outcome, other.get(test, "missing"))
            for test, outcome in sorted(plain.items()) if other.get(test, "missing") != outcome]


@dataclass(frozen=True)
class Verdict:
    """What one comparison found: differences nobody allowed, and allow-list entries
    whose test ran in both and no longer differs (stale: remove them)."""

    unexpected: list[Difference]
    stale: list[tuple[str, str]]

    @property
    def ok(self) -> bool:
        return not self.unexpected and not self.stale

    def __str__(self) -> str:
        lines = [f"not allowed: {difference}" for difference in self.unexpected]
        lines += [f"stale allow-list entry (no longer differs): {run}: {test}"
                  for test, run in self.stale]
        return "\n".join(lines) or "no difference outside the allow-list"


def judge(runs: dict[str, Outcomes], allowed: dict[tuple[str, str], Allowed]) -> Verdict:
    """Compare every run with ``runs["plain"]`` against the allow-list."""
    plain = runs["plain"]
    unexpected: list[Difference] = []
    seen: set[tuple[str, str]] = set()
    for run, found in runs.items():
        if run == "plain":
            continue
        for difference in differences(plain, run, found):
            seen.add((difference.test, run))
            if (difference.test, run) not in allowed:
                unexpected.append(difference)
    stale = sorted((test, run) for test, run in allowed
                   if run in runs and test in plain and test in runs[run]
                   and (test, run) not in seen)
    return Verdict(unexpected, stale)
