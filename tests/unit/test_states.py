"""The transition table: every pair of states is allowed or refused as the protocol says."""

from __future__ import annotations

import itertools

import pytest

from celery_idem.errors import InvalidTransition
from celery_idem.states import MOVES, TRANSITIONS, State, check, move, sources

P, R, S, F, U = State.PENDING, State.RUNNING, State.SUCCEEDED, State.FAILED, State.UNCERTAIN

#: The protocol's diagram, written out independently of celery_idem.states.
PROTOCOL = {
    (None, P), (None, R),
    (P, R), (P, F),
    (R, R), (R, S), (R, F), (R, P), (R, U),
    (F, P),
    (U, P), (U, S),
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
    """duplicate and late_finish are recorded without a target state."""
    assert MOVES["duplicate"].target is None and MOVES["late_finish"].target is None


def test_every_move_is_within_the_table():
    """Each named move's sources and target are pairs the table allows."""
    for m in MOVES.values():
        for source in m.sources:
            check(source, m.target)


def test_unknown_move_name_is_refused():
    """A typo in a move name cannot write anything."""
    with pytest.raises(InvalidTransition):
        move("finished")


def test_sources_give_the_where_guard():
    """The guard of a move lists its source states by value."""
    assert sources("dead_lettered") == ["PENDING", "RUNNING"]
    assert sources("claimed") == ["PENDING"]
