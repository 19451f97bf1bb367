"""tests/compat/compare.py: outcomes from junit xml, differences from plain Celery, the
allow-list, and stale entries (no service needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compat.compare import case_id, load_allowed, outcomes
from tests.compat.compare import judge as judge_runs

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="t.integration.test_canvas.test_chord" name="test_simple_chord"/>
<testcase classname="t.integration.test_tasks.test_tasks" name="test_retry">
  <failure message="assert 'FAILURE' == 'RETRY'"/></testcase>
<testcase classname="t.integration.test_tasks.test_tasks" name="test_broken_setup">
  <error message="fixture"/></testcase>
<testcase classname="t.integration.test_tasks" name="test_eager[1]">
  <skipped type="pytest.xfail" message="xfail"/></testcase>
</testsuite></testsuites>
"""

ALLOWED = """
[[allowed]]
test = "test_tasks::test_tasks::test_retry"
runs = ["per_call", "all_arguments"]
reason = "a stated consequence"
"""


@pytest.fixture
def allow_list(tmp_path: Path):
    def write(text: str = ALLOWED):
        path = tmp_path / "allowed.toml"
        path.write_text(text)
        return load_allowed(path)
    return write


def test_outcomes_read_each_testcase_of_the_junit_file(tmp_path: Path):
    junit = tmp_path / "run.xml"
    junit.write_text(JUNIT)
    assert outcomes(junit) == {
        "test_canvas::test_chord::test_simple_chord": "passed",
        "test_tasks::test_tasks::test_retry": "failed",
        "test_tasks::test_tasks::test_broken_setup": "failed",
        "test_tasks::test_eager[1]": "skipped",
    }
    assert outcomes(tmp_path / "never-written.xml") == {}


def test_a_test_id_is_module_class_and_name_without_the_package():
    assert case_id("t.integration.test_canvas.test_chain", "test_x[a.b]") == \
        "test_canvas::test_chain::test_x[a.b]"


def test_a_difference_nobody_allowed_fails(allow_list):
    verdict = judge_runs({"plain": {"a": "passed", "b": "passed"},
                          "template": {"a": "passed", "b": "failed"}}, allow_list())
    assert not verdict.ok
    assert [(d.test, d.run, d.plain, d.outcome) for d in verdict.unexpected] == [
        ("b", "template", "passed", "failed")]
    assert "not allowed: template: b: passed plain, failed here" in str(verdict)


def test_a_test_a_run_did_not_report_is_missing_not_equal(allow_list):
    verdict = judge_runs({"plain": {"a": "passed"}, "per_call": {}}, allow_list())
    assert [d.outcome for d in verdict.unexpected] == ["missing"]


def test_an_allowed_difference_passes_only_in_the_runs_it_names(allow_list):
    retry = "test_tasks::test_tasks::test_retry"
    allowed = allow_list()
    assert judge_runs({"plain": {retry: "passed"}, "per_call": {retry: "failed"},
                       "all_arguments": {retry: "failed"}}, allowed).ok
    verdict = judge_runs({"plain": {retry: "passed"}, "template": {retry: "failed"}}, allowed)
    assert [d.run for d in verdict.unexpected] == ["template"]


def test_an_entry_whose_test_no_longer_differs_is_stale(allow_list):
    retry = "test_tasks::test_tasks::test_retry"
    verdict = judge_runs({"plain": {retry: "passed"}, "per_call": {retry: "passed"},
                          "all_arguments": {retry: "failed"}}, allow_list())
    assert not verdict.ok and not verdict.unexpected
    assert verdict.stale == [(retry, "per_call")]
    assert "stale allow-list entry" in str(verdict)


def test_an_entry_for_a_test_or_run_that_did_not_run_is_not_stale(allow_list):
    """A test outside the CI selection, or a run not made, says nothing of the entry."""
    retry = "test_tasks::test_tasks::test_retry"
    assert judge_runs({"plain": {"other": "passed"}, "per_call": {"other": "passed"}},
                      allow_list()).ok
    assert judge_runs({"plain": {retry: "passed"}, "template": {retry: "passed"}},
                      allow_list()).ok


def test_an_entry_without_a_reason_or_with_an_unknown_verdict_is_refused(allow_list):
    with pytest.raises(ValueError, match="reason must be given"):
        allow_list(ALLOWED.replace('"a stated consequence"', '"  "'))
    with pytest.raises(ValueError, match="verdict must be one of"):
        allow_list(ALLOWED + 'verdict = "bug"\n')
    with pytest.raises(ValueError, match="listed twice"):
        allow_list(ALLOWED + ALLOWED)


def test_one_entry_may_name_several_tests_for_one_reason(allow_list):
    table = allow_list('''
[[allowed]]
tests = ["test_tasks::test_tasks::test_retry", "test_canvas::test_chord::test_parent_ids"]
runs = ["template"]
reason = "equal calls are one job"
''')
    assert sorted(table) == [("test_canvas::test_chord::test_parent_ids", "template"),
                             ("test_tasks::test_tasks::test_retry", "template")]
    assert {entry.reason for entry in table.values()} == {"equal calls are one job"}


def test_the_committed_allow_list_loads():
    load_allowed()
