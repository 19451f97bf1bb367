"""The transition table: every pair of states is allowed or refused as the protocol says."""

from __future__ import annotations

import itertools

import pytest

from celery_idem.errors import InvalidTransition
from celery_idem.states import MOVES, TRANSITIONS, Guard, State, applies, check, move

P, R, S, F, U = State.PENDING, State.RUNNING, State.SUCCEEDED, State.FAILED, State.UNCERTAIN
X = State.EXPIRED

#: The protocol's diagram, written out independently of celery_idem.states.
PROTOCOL = {
    (None, P), (None, R),
    # An optimistic atomic body's commit inserts its key's row finished (``committed``).
    (None, S),
    (P, R), (P, F),
    (R, R), (R, S), (R, F), (R, P), (R, U),
    (F, P),
    (U, P), (U, S),
    (P, X), (X, P),
}


@pytest.mark.parametrize("source,target", list(itertools.product([None, *State], State)))
def test_every_pair_is_allowed_exactly_when_the_protocol_allows_it(source, target):
    """check() accepts the protocol's transitions and raises on every other pair."""
    if (source, target) in PROTOCOL:
        check(source, target)
    else:
        with pytest.raises(InvalidTransition):
            check(source, target)


def test_succeeded_is_final():
    """Nothing leaves SUCCEEDED, not even an operator."""
    assert TRANSITIONS[S] == frozenset()


def test_failed_only_goes_back_to_pending():
    """FAILED is final until an operator resets it."""
    assert TRANSITIONS[F] == {P}


def test_history_only_moves_change_no_state():
    """duplicate and late_finish have no target state: the row's state stays."""
    assert MOVES["duplicate"].target is None and MOVES["late_finish"].target is None


def test_every_move_that_changes_a_claimed_row_is_fenced():
    """A move from RUNNING written by a claim holder or an operator names the attempt."""
    for m in MOVES.values():
        if State.RUNNING in m.sources and m.event not in ("taken_over", "late_finish"):
            assert Guard.FENCED in m.guard, m.event


def test_only_a_claim_takes_a_live_key():
    """Of the moves into RUNNING, only claims exist, and taking over needs an expired lease."""
    into_running = {m.event for m in MOVES.values() if m.target is State.RUNNING}
    assert into_running == {"claimed", "taken_over", "heartbeat", "replaced"}
    assert Guard.FENCED in MOVES["replaced"].guard
    assert Guard.LEASE_EXPIRED in MOVES["taken_over"].guard
    assert not MOVES["heartbeat"].recorded


def test_unknown_move_name_is_refused():
    """A typo in a move name cannot write anything."""
    with pytest.raises(InvalidTransition):
        move("finished")


def test_applies_answers_from_the_table():
    """Which actions apply to which state comes from the moves' sources."""
    assert applies("reset", "FAILED") and applies("reset", State.UNCERTAIN)
    assert not applies("reset", "SUCCEEDED") and not applies("resolved", "FAILED")
    assert MOVES["dead_lettered"].source_values() == ["PENDING", "RUNNING"]


def test_the_history_keeps_what_the_job_row_cannot():
    """The happy path and a replay record nothing (the row holds created, started,
    finished, attempt and worker); retries, releases, take-overs, failures, operator
    actions and late finishes are recorded; every move but the two that only touch a
    timestamp is announced (the transition signal and its log line)."""
    unrecorded = {m.event for m in MOVES.values() if not m.recorded}
    assert unrecorded == {"published", "claimed", "succeeded", "committed", "duplicate",
                          "heartbeat", "sent"}
    for event in ("retry_scheduled", "released", "taken_over", "failed", "dead_lettered",
                  "reset", "resolved", "late_finish", "attempt_lost", "uncertain"):
        assert MOVES[event].recorded, event
    assert {m.event for m in MOVES.values() if not m.announced} == {"heartbeat", "sent"}


def test_every_attempt_ends_in_a_move_that_says_so():
    """The moves that end an attempt are those that take a RUNNING row out of RUNNING,
    and the take-over (the attempt before its own): not a heartbeat, a hand-over to a
    replacement, a step or a late finish, which leave the attempt running."""
    ending = {m.event for m in MOVES.values() if m.ends_attempt}
    leaving = {m.event for m in MOVES.values()
               if R in m.sources and m.target not in (None, R)}
    assert ending == leaving | {"taken_over"}


def test_every_attempt_start_is_kept_without_a_history_row_on_the_happy_path():
    """Each move that ends an attempt keeps its start in its history row, but the
    success, which is not recorded: it ends the last attempt (nothing claims a finished
    key), whose start the job row keeps. The backends read the start from the row as it
    was before the move: only a claim rewrites started_at."""
    silent = [m for m in MOVES.values() if m.ends_attempt and not m.records_start]
    assert [m.event for m in silent] == ["succeeded"]
    assert all(m.target is not None and not TRANSITIONS[m.target] & {R} for m in silent)
    for m in MOVES.values():
        if m.records_start and "started_at" in m.sets:
            assert m.event in ("claimed", "taken_over"), m.event
