"""The README and the documentation site describe the product as it is, for its reader.

History (issue and item numbers, commit hashes, "sittings") belongs in docs/decisions/ and
CHANGELOG.md only; the README fits a screen and keeps the two quickstart commands that
.ci/run runs; mkdocs.yml's nav and the pages under docs/ are the same set. The site's
build with warnings as errors is the checks tier's ``docs`` check (tests/tiers.py), and
tests/browser/test_docs_site.py opens it in Chromium.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
QUICKSTART = ("python3 example_project/demo.py", "python3 tests/run.py")

#: What reads as the project's history rather than the product.
HISTORY = [
    ("an issue number", re.compile(r"\bissues?\s+#?\d+", re.I)),
    ("an item number", re.compile(r"\bitems?\s+#?\d+", re.I)),
    ("a sitting", re.compile(r"\bsittings?\b", re.I)),
]
#: A commit hash as git abbreviates it: 7 to 40 lowercase hex digits, not all digits.
HASH = re.compile(r"\b[0-9a-f]{7,40}\b")
#: Hex words that are not commits (none today: add one here with the reason it is not).
NOT_COMMITS: set[str] = set()
#: One nav entry of mkdocs.yml: ``- Title: path.md`` or ``- path.md``.
NAV_ENTRY = re.compile(r"^\s*-\s+(?:[^:\n]+:\s+)?([\w./-]+\.md)\s*$")


def user_pages() -> list[Path]:
    """README.md and every page under docs/ but the decision records."""
    pages = sorted(p for p in DOCS.rglob("*.md") if "decisions" not in p.relative_to(DOCS).parts)
    return [README, *pages]


def history_in(text: str) -> list[str]:
    found = [f"{what}: {m.group(0)!r}" for what, pattern in HISTORY
             for m in pattern.finditer(text)]
    found += [f"a commit hash: {m.group(0)!r}" for m in HASH.finditer(text)
              if not m.group(0).isdigit() and m.group(0) not in NOT_COMMITS]
    return found


@pytest.mark.parametrize("page", user_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages_tell_no_history(page: Path) -> None:
    assert history_in(page.read_text()) == []


def test_the_history_check_finds_each_kind() -> None:
    """The check itself can fail."""
    text = ("since issue 21, item 2 of it, in one sitting at dc6ecc2; "
            "not 1234567 nor 10,000 nor a decade")
    assert history_in(text) == ["an issue number: 'issue 21'", "an item number: 'item 2'",
                                "a sitting: 'sitting'", "a commit hash: 'dc6ecc2'"]


def test_the_readme_fits_a_screen_and_keeps_its_quickstart() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines (at most 150)"
    for command in QUICKSTART:
        assert command in lines, f"README.md lost its quickstart line {command!r}"


def test_the_readmes_links_reach_files_of_the_repository() -> None:
    """GitHub and PyPI show the README outside the site: its relative links name files."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    relative = [t for t in targets if "://" not in t]
    assert len(relative) > 10, "the README's links were not read"
    assert [t for t in relative if not (ROOT / t).exists()] == []


def test_ci_runs_the_readmes_test_command() -> None:
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert QUICKSTART[1] in commands


def nav_pages() -> list[str]:
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text.split("\nnav:\n", 1)[1]
    return [m.group(1) for line in nav.splitlines() if (m := NAV_ENTRY.match(line))]


def test_every_nav_entry_is_a_page_and_every_page_is_in_the_nav() -> None:
    listed = nav_pages()
    assert len(listed) > 40, "the nav of mkdocs.yml was not read"
    assert len(listed) == len(set(listed)), "a page is in the nav twice"
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert sorted(set(listed) - pages) == [], "nav entries without a page"
    assert sorted(pages - set(listed)) == [], "pages missing from the nav"
