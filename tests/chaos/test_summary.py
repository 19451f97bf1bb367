"""The reliability page's release table is the committed reports' own
(tests/chaos/summary.py): regenerate it with ``python -m tests.chaos.summary --write``
when a release report changes."""

from __future__ import annotations

import json

from tests.chaos import summary


def test_the_page_shows_the_committed_release_reports():
    page = summary.PAGE.read_text()
    assert page == summary.render(page, summary.reports()), (
        "docs/explanation/reliability.md is out of date: run python -m tests.chaos.summary --write")


def test_a_failed_check_reads_failed_in_its_stacks_column(tmp_path):
    report = json.loads((summary.RESULTS / "release-pgbouncer-failed.json").read_text())
    (tmp_path / "release-pgbouncer.json").write_text(json.dumps(report))
    text = summary.table(summary.reports(tmp_path))
    assert text.splitlines()[0] == "| | PgBouncer |"
    assert "| result | **FAILED** |" in text
    assert "| jobs lost (published, not SUCCEEDED) | 1 **(failed)** |" in text
    assert "| SIGKILLs (children + whole workers) | 150 + 48 |" in text
