"""docs/explanation/reliability.md names a test for every row: each named test exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: `tests/x.py::Class::name[id]`, or `::name` meaning the file named last before it.
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)?((?:::\w+)+)(?:\[[^\]]*\])?`")


def references() -> list[tuple[str, list[str]]]:
    text = (ROOT / "docs" / "explanation" / "reliability.md").read_text()
    found, last = [], ""
    for match in REFERENCE.finditer(text):
        last = match.group(1) or last
        found.append((last, match.group(2).strip(":").split("::")))
    return found


def test_every_test_the_reliability_page_names_exists():
    refs = references()
    assert len(refs) > 40, "the page's test references were not found"
    missing = []
    for path, names in refs:
        source = (ROOT / path).read_text() if (ROOT / path).exists() else ""
        if not all(re.search(rf"^\s*(def|class) {name}\b", source, re.M) for name in names):
            missing.append(f"{path}::{'::'.join(names)}")
    assert not missing, "docs/explanation/reliability.md names tests that do not exist: " + \
        ", ".join(missing)
