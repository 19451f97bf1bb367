"""The demo's check of a non-idempotent effect: a repeat is accepted only when the worker
that made it was SIGKILLed after it and before the next attempt's."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "example_project"))

from shopdemo.checks import repeats_without_crash  # noqa: E402
from shopdemo.processes import Kill  # noqa: E402


def _at(second: float) -> datetime:
    return datetime.fromtimestamp(1_800_000_000 + second, UTC)


SENT_TWICE = [("confirm/1", 1, "shop1@demo", _at(10)), ("confirm/1", 2, "shop2@demo", _at(20))]


def test_a_repeat_whose_worker_was_killed_in_its_window_is_accepted():
    kills = [Kill("shop1@demo", _at(12).timestamp())]
    assert repeats_without_crash(SENT_TWICE, {"confirm/1": 2}, kills) == []


def test_a_repeat_without_a_kill_of_its_worker_in_its_window_is_refused():
    for kills in ([], [Kill("shop2@demo", _at(12).timestamp())],   # another worker
                  [Kill("shop1@demo", _at(9).timestamp())],        # before the send
                  [Kill("shop1@demo", _at(21).timestamp())]):      # after the next one
        assert len(repeats_without_crash(SENT_TWICE, {"confirm/1": 2}, kills)) == 1, kills


def test_an_effect_missing_for_the_attempt_that_succeeded_is_refused():
    kills = [Kill("shop1@demo", _at(12).timestamp())]
    assert repeats_without_crash(SENT_TWICE[:1], {"confirm/1": 2}, kills) != []
