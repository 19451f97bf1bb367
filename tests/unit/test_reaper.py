"""The recovery pass's pure parts: its report, the re-dispatch backoff, the lost-message query."""

from __future__ import annotations

from datetime import UTC, datetime

from django.test import override_settings

from celery_idem.recovery import due
from celery_idem.recovery import sweep as reaper


def test_report_counts_per_action_and_task():
    """The report groups counts by action, then by task, and prints one line per action."""
    report = reaper.Report()
    report.add("released", "a")
    report.add("released", "b")
    report.add("released", "a")
    report.add("dead_lettered", "b")
    assert report.as_dict() == {"released": {"a": 2, "b": 1}, "dead_lettered": {"b": 1}}
    assert report.total("released") == 3
    assert report.lines() == ["released: 3 (a: 2, b: 1)", "dead_lettered: 1 (b: 1)"]


def test_an_empty_report_says_so():
    """A pass that did nothing says "nothing to do" and returns an empty dict."""
    assert str(reaper.Report()) == "nothing to do" and reaper.Report().as_dict() == {}


@override_settings(CELERY_IDEM_DISPATCH_TIMEOUT=10, CELERY_IDEM_DISPATCH_MAX_BACKOFF=100)
def test_redispatch_wait_doubles_up_to_the_cap():
    """10 s, 20 s, 40 s, 80 s, then the 100 s cap forever."""
    assert [due.redispatch_wait(n) for n in range(7)] == [10, 20, 40, 80, 100, 100, 100]
    assert due.redispatch_wait(10_000) == 100


@override_settings(CELERY_IDEM_DISPATCH_TIMEOUT=300, CELERY_IDEM_DISPATCH_MAX_BACKOFF=10)
def test_a_cap_below_the_timeout_means_the_timeout():
    """The cap never shortens the first wait."""
    assert due.redispatch_wait(0) == due.redispatch_wait(5) == 300


@override_settings(CELERY_IDEM_DISPATCH_TIMEOUT=0)
def test_zero_timeout_gives_one_level_query():
    """Without a timeout every PENDING row past its due time qualifies: one range of
    the sent ones (every dispatch count), and the never-sent ones."""
    sent = due.sent_and_lost(datetime(2030, 1, 1, tzinfo=UTC))
    assert len(sent) == 1 and "dispatch_count__gte', 0" in str(sent[0])
    assert len(due.lost_messages(datetime(2030, 1, 1, tzinfo=UTC))) == 2


@override_settings(CELERY_IDEM_DISPATCH_TIMEOUT=10, CELERY_IDEM_DISPATCH_MAX_BACKOFF=100)
def test_each_dispatch_count_waits_its_own_back_off_until_the_cap():
    """10, 20, 40, 80 s for counts 0-3, then 100 s for every count from 4 on."""
    levels = due.sent_and_lost(datetime(2030, 1, 1, tzinfo=UTC))
    assert [str(level).count("dispatch_count") for level in levels] == [1] * 5
    assert "dispatch_count__gte', 4" in str(levels[-1])
    assert all(f"dispatch_count', {n})" in str(levels[n]) for n in range(4))
