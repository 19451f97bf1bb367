"""docs/explanation/celery-compatibility.md is what tests/compat/report.py makes of the committed
result file and allow-list (so the page cannot drift), and the generator says what each
feature's tests found."""

from __future__ import annotations

import json
from pathlib import Path

from tests.compat.compare import load_allowed
from tests.compat.report import PAGE, RESULTS, feature_of, render

ALLOWED = """
[[allowed]]
test = "test_canvas::test_chord::test_chord_in_chain"
runs = ["per_call"]
reason = "the stated reason"

[[allowed]]
test = "test_tasks::test_tasks::test_send_task_by_name"
runs = ["per_call"]
verdict = "unsupported"
reason = "no key can ride along"
"""


def test_the_committed_page_is_what_the_committed_result_file_makes():
    expected = render(json.loads(RESULTS.read_text()), load_allowed())
    assert PAGE.read_text() == expected, \
        "docs/explanation/celery-compatibility.md is stale: run python tests/compat/report.py"


def test_a_feature_is_works_difference_unsupported_or_a_bug_by_its_tests(tmp_path: Path):
    allowed = tmp_path / "allowed.toml"
    allowed.write_text(ALLOWED)
    chord, send = ("test_canvas::test_chord::test_chord_in_chain",
                   "test_tasks::test_tasks::test_send_task_by_name")
    chain = "test_canvas::test_chain::test_simple_chain"
    plain = {chord: "passed", send: "passed", chain: "passed"}
    page = render({"celery": "5.7.0", "selection": "CI", "runs": {
        "plain": plain, "per_call": {chord: "failed", send: "failed", chain: "passed"},
        "template": {**plain, chain: "failed"}}}, load_allowed(allowed))
    assert "| chords | 1 | works, with a difference | works |" in page
    assert "| `send_task` | 1 | unsupported | works |" in page
    assert "| chains | 1 | works | differs (a bug, not allowed) |" in page
    assert f"- `{chord}` (`PER_CALL`; passed plain, failed with the extension): " \
        "the stated reason" in page
    assert "**not allowed: a bug of the extension**" in page
    assert "| plain Celery | 3 | 0 | 0 |" in page


def test_each_test_belongs_to_the_first_feature_it_names():
    assert feature_of("test_canvas::test_chord::test_chord_on_error") == "chords"
    assert feature_of("test_canvas::test_chain::test_chain_replaced_with_a_chain") == \
        "`replace()`"
    assert feature_of("test_tasks::test_tasks::test_basic_task") == \
        "calling (`delay`, `apply_async`, results)"
