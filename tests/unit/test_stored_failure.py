"""A replayed failure (StoredFailure.from_record): the body's own exception class where it
is loaded, the stored failure alone where it is not. No services."""

from __future__ import annotations

import json
import pickle
import sys
import traceback

import pytest
from celery import Celery

from celery_idem.claims import describe_error
from celery_idem.errors import IdempotencyError, StoredFailure


class Declined(Exception):
    """A body's own exception: two arguments, and a text its __init__ prepares."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code

    def __str__(self) -> str:
        return f"declined {self.code}"


def replay(exc: BaseException) -> StoredFailure:
    """The replay of ``exc`` as a duplicate meets it: stored as JSON, read back."""
    return StoredFailure.from_record(json.loads(json.dumps(describe_error(exc))))


@pytest.mark.parametrize("exc", [ValueError("no 1"), KeyError("k"), OSError(2, "gone"),
                                 Declined(402, "card")], ids=lambda exc: type(exc).__name__)
def test_a_replay_is_the_bodys_exception_and_a_stored_failure(exc):
    replayed = replay(exc)
    assert isinstance(replayed, type(exc)) and isinstance(replayed, StoredFailure)
    assert isinstance(replayed, IdempotencyError)
    assert replayed.args == exc.args and str(replayed) == str(exc)
    assert (replayed.exc_type, replayed.exc_message) == (type(exc).__name__, str(exc))
    assert replayed.stored_traceback == "".join(traceback.format_exception(exc))


def test_one_except_clause_catches_the_first_failure_and_its_replay():
    caught = []
    for exc in (Declined(402, "card"), replay(Declined(402, "card"))):
        try:
            raise exc
        except Declined as error:
            caught.append(error)
    assert len(caught) == 2


def test_replays_of_one_class_share_one_type():
    assert type(replay(ValueError("a"))) is type(replay(ValueError("b")))
    assert type(replay(ValueError("a"))) is not type(replay(KeyError("a")))


def test_celerys_result_backend_hands_the_caller_the_original_type_and_arguments():
    app = Celery(set_as_current=False, backend="cache+memory://")
    sent = app.backend.prepare_exception(replay(Declined(402, "card")), "json")
    rebuilt = app.backend.exception_to_python(json.loads(json.dumps(sent)))
    assert type(rebuilt) is Declined and rebuilt.args == (402, "card")


def test_a_replay_pickles_to_the_same_replay():
    replayed = replay(Declined(402, "card"))
    again = pickle.loads(pickle.dumps(replayed))
    assert type(again) is type(replayed) and again.args == replayed.args
    assert again.stored_traceback == replayed.stored_traceback


def test_a_class_whose_module_is_not_loaded_replays_as_the_stored_failure_alone():
    record = {"type": "Declined", "module": "shop.not_imported_here", "message": "declined"}
    assert "shop.not_imported_here" not in sys.modules
    replayed = StoredFailure.from_record(record)
    assert type(replayed) is StoredFailure and str(replayed) == "Declined: declined"
    assert "shop.not_imported_here" not in sys.modules  # a record imports nothing


@pytest.mark.parametrize("record", [
    {"type": "ExceptionGroup", "module": "builtins", "message": "m"},  # wants its own args
    {"type": "path", "module": "os", "message": "m"},  # not an exception class
    {"type": "SystemExit", "module": "builtins", "message": "m"},  # not an Exception
    {},
], ids=["exception-group", "not-a-class", "base-exception", "empty"])
def test_what_cannot_be_rebuilt_replays_as_the_stored_failure_alone(record):
    assert type(StoredFailure.from_record(record)) is StoredFailure


def test_a_stored_failure_record_of_a_stored_failure_is_not_wrapped_twice():
    replayed = replay(StoredFailure("ValueError: x", {"type": "ValueError", "message": "x"}))
    assert type(replayed) is StoredFailure


def test_arguments_that_are_not_json_are_left_out_of_the_record():
    record = describe_error(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"))
    assert "args" not in record
    replayed = StoredFailure.from_record(json.loads(json.dumps(record)))
    assert isinstance(replayed, UnicodeDecodeError) and replayed.args == (record["message"],)
