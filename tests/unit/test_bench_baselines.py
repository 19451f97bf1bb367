"""The performance page's table is what the committed baselines generate, and the runner
hands each suite the options it can use (pure Python: no service, nothing run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import suites
from bench.lib import report, results

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "explanation" / "performance.md"


def test_the_performance_page_shows_the_table_the_baselines_generate():
    """Regenerate it with ``python -m bench report --markdown --write PAGE``."""
    assert report.between_markers(PAGE) == report.baseline_table(results.load_baselines())


def test_every_stack_has_a_baseline_whose_runs_say_where_they_came_from():
    baselines = results.load_baselines()
    assert [b["stack"] for b in baselines] == list(results.STACK_ORDER)
    for baseline in baselines:
        assert baseline["format"] == results.FORMAT and baseline["release"]
        assert any(r["suite"] == "end-to-end" for r in baseline["results"])
        for result in baseline["results"]:
            assert result["stack"] == baseline["stack"]
            assert result["suite"] in suites.SUITES
            assert (ROOT / result["source"]).is_file(), result["source"]
            assert result["environment"]["when"] and result["environment"]["machine"]


def test_every_row_of_the_table_is_a_ratio_within_one_run():
    """The plain task's own row is 1.00 in every round: each ratio divides by the
    baseline variant of the same round of the same run."""
    for baseline in results.load_baselines():
        assert set(report.baseline_ratios(baseline, "end-to-end", "django", "django")) \
            == {1.0}


def test_quick_runs_a_few_hundred_tasks_in_one_round_on_redis():
    argv = suites.arguments("end-to-end", suites.Options(quick=True))
    assert argv == ["--database", "postgres", "--brokers", "redis", "--variants",
                    "django,idem,atomic,replay", "--n", "300", "--rounds", "1"]
    # what is given wins over --quick; the suite's own arguments come last
    argv = suites.arguments("publishing", suites.Options(
        stack="mysql", n=50, quick=True, extra=["--help"]))
    assert argv == ["--database", "mysql", "--n", "50", "--rounds", "1", "--help"]


@pytest.mark.parametrize(("suite", "options", "says"), [
    ("wal", suites.Options(stack="mysql"), "runs on postgres"),
    ("wal", suites.Options(broker="rabbitmq"), "takes no --broker"),
    ("statements", suites.Options(variants="idem"), "takes no --variants"),
    ("nope", suites.Options(), "unknown suite"),
])
def test_a_suite_refuses_what_it_cannot_use(suite, options, says):
    with pytest.raises(SystemExit, match=says):
        suites.arguments(suite, options)


def test_every_suite_declares_its_question_and_stacks():
    for name in suites.SUITES:
        suite = suites.load(name)
        assert suite.QUESTION.endswith("?") and set(suite.STACKS) <= set(suites.ALL_STACKS)
        assert callable(suite.arguments) and callable(suite.main)
