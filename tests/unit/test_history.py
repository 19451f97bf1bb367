"""``history.path_errors``: a history is legal when it follows the move table, with the
unrecorded moves (a heartbeat, an outbox send) allowed between its rows."""

from __future__ import annotations

from celery_idem.history import path_errors


def test_the_plain_path_is_legal() -> None:
    lines = [("published", None, "PENDING"), ("claimed", "PENDING", "RUNNING"),
             ("succeeded", "RUNNING", "SUCCEEDED"), ("duplicate", "SUCCEEDED", "SUCCEEDED")]
    assert path_errors(lines, "SUCCEEDED") == []


def test_a_retry_then_a_take_over_is_legal() -> None:
    lines = [("published", None, "PENDING"), ("claimed", "PENDING", "RUNNING"),
             ("retry_scheduled", "RUNNING", "PENDING"), ("claimed", "PENDING", "RUNNING"),
             ("taken_over", "RUNNING", "RUNNING"), ("failed", "RUNNING", "FAILED")]
    assert path_errors(lines, "FAILED") == []


def test_a_move_the_table_does_not_allow_is_named() -> None:
    lines = [("published", None, "PENDING"), ("succeeded", "PENDING", "SUCCEEDED")]
    assert path_errors(lines, "SUCCEEDED") == [
        "line 2: succeeded does not go from PENDING to SUCCEEDED"]


def test_a_gap_between_rows_is_named() -> None:
    lines = [("published", None, "PENDING"), ("succeeded", "RUNNING", "SUCCEEDED")]
    assert path_errors(lines, "SUCCEEDED") == [
        "line 2: starts from RUNNING, but the job was in PENDING"]


def test_a_row_state_the_history_cannot_reach_is_named() -> None:
    lines = [("published", None, "PENDING")]
    assert path_errors(lines, "SUCCEEDED") == ["the job is SUCCEEDED, not reachable from PENDING"]


def test_unknown_and_unrecorded_events_are_named() -> None:
    lines = [("published", None, "PENDING"), ("teleported", "PENDING", "PENDING"),
             ("heartbeat", "PENDING", "PENDING")]
    errors = path_errors(lines, "PENDING")
    assert errors[0] == "line 2: no move named 'teleported'"
    assert errors[1].startswith("line 3: heartbeat is never recorded")
