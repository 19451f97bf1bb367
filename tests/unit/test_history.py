"""``history.path_errors``: a history is legal when it follows the move table, with the
unrecorded moves (the happy path, a heartbeat, an outbox send, a replay) allowed between
its rows."""

from __future__ import annotations

from celery_idem.history import path_errors


def test_the_plain_path_is_legal() -> None:
    # published, claimed, succeeded and replays record nothing: an empty history.
    assert path_errors([], "SUCCEEDED") == []
    assert path_errors([("failed", "RUNNING", "FAILED")], "FAILED") == []


def test_a_retry_then_a_take_over_is_legal() -> None:
    lines = [("retry_scheduled", "RUNNING", "PENDING"), ("taken_over", "RUNNING", "RUNNING"),
             ("failed", "RUNNING", "FAILED")]
    assert path_errors(lines, "FAILED") == []


def test_a_move_the_table_does_not_allow_is_named() -> None:
    lines = [("failed", "PENDING", "FAILED")]
    assert path_errors(lines, "FAILED") == [
        "line 1: failed does not go from PENDING to FAILED"]


def test_a_gap_between_rows_is_named() -> None:
    lines = [("failed", "RUNNING", "FAILED"), ("released", "RUNNING", "PENDING")]
    assert path_errors(lines, "PENDING") == [
        "line 2: starts from RUNNING, but the job was in FAILED"]


def test_a_row_state_the_history_cannot_reach_is_named() -> None:
    lines = [("failed", "RUNNING", "FAILED")]
    assert path_errors(lines, "SUCCEEDED") == ["the job is SUCCEEDED, not reachable from FAILED"]


def test_unknown_events_and_impossible_unrecorded_moves_are_named() -> None:
    lines = [("retry_scheduled", "RUNNING", "PENDING"), ("teleported", "PENDING", "PENDING"),
             ("heartbeat", "PENDING", "PENDING")]
    assert path_errors(lines, "PENDING") == [
        "line 2: no move named 'teleported'",
        "line 3: heartbeat does not go from PENDING to PENDING"]


def test_a_history_written_when_the_happy_path_recorded_stays_legal() -> None:
    lines = [("published", None, "PENDING"), ("claimed", "PENDING", "RUNNING"),
             ("succeeded", "RUNNING", "SUCCEEDED"), ("duplicate", "SUCCEEDED", "SUCCEEDED")]
    assert path_errors(lines, "SUCCEEDED") == []
