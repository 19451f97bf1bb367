"""Every error celery-idem raises, under one root.

Each class's docstring is its default message. Driver errors are kept as ``__cause__``.
This module imports nothing from Django or Celery so that it is safe to import anywhere.
"""

from __future__ import annotations

import sys
from typing import Any


class IdempotencyError(Exception):
    """celery-idem failed."""

    # One positional argument only: Celery rebuilds a task's exception on the caller's
    # side as ``cls(*args)``.
    def __init__(self, message: str | None = None, **details: Any) -> None:
        super().__init__(message or (self.__doc__ or "").strip())
        self.details = details


class ConfigurationError(IdempotencyError):
    """A task or setting is configured in a way celery-idem cannot work with."""


class ReservedAttribute(IdempotencyError, AttributeError):
    """A task body assigned one of the names IdempotentTask reserves for what the body
    sees (``attempt``: the claim's fencing token)."""


class ArgumentsNotJSON(IdempotencyError, TypeError):
    """The task's arguments are not plain JSON (str, int, float, bool, None, list, dict)."""


class InvalidKey(IdempotencyError, ValueError):
    """The idempotency key is not a non-empty string that fits the key column."""


class MissingKey(InvalidKey):
    """This task takes its idempotency key per call: pass apply_async(idempotency_key=...)."""


class KeyMismatch(IdempotencyError):
    """The idempotency key already exists with different arguments."""

    @classmethod
    def build(cls, namespace: str, key: str, expected: str, got: str,
              stored: Any = None, new: Any = None) -> KeyMismatch:
        """``stored``/``new``: the arguments (``{"args": [...], "kwargs": {...}}``) of the
        first call and of this one, named in the message when the first were stored."""
        shown = (f"arguments {_short(stored)}, not {_short(new)}" if stored is not None
                 else f"arguments of fingerprint {expected[:12]}..., not {got[:12]}...")
        return cls(
            f"idempotency key {key!r} in namespace {namespace!r} was first used with "
            f"{shown}: use a key that names the arguments, or a new key",
            namespace=namespace, key=key, expected=expected, got=got, stored=stored, new=new,
        )


def _short(arguments: Any, limit: int = 200) -> str:
    text = repr(arguments)
    return text if len(text) <= limit else text[:limit] + "..."


class InvalidTransition(IdempotencyError):
    """The state machine does not allow this transition."""


class ClaimError(IdempotencyError):
    """The claim on an idempotency key could not be used."""


class ClaimLost(ClaimError):
    """A newer attempt owns this key: this attempt's claim was fenced out."""


class InProgress(ClaimError):
    """Another attempt holds a live claim on this key."""


class ResultNotJSON(IdempotencyError, TypeError):
    """The task returned a value that is not plain JSON, so it cannot be stored and replayed."""


class StepNotJSON(IdempotencyError, TypeError):
    """A step returned a value that is not plain JSON, so it cannot be stored as its checkpoint."""


class InvalidStep(IdempotencyError, ValueError):
    """A step name must be a non-empty string of at most 200 characters."""


class StoredFailure(IdempotencyError):
    """The key already failed; this is the stored failure, replayed.

    ``from_record`` raises it as the body's own exception class as well, where that class
    is already imported in this process: a duplicate's ``except ValueError`` then catches
    what the first call's did, and Celery's result backend hands its caller the same type
    and arguments as the first caller's ``AsyncResult.get()`` raised."""

    def __init__(self, message: str = "", error: dict[str, Any] | None = None) -> None:
        error = error or {}
        self.exc_type: str = error.get("type", "")
        self.exc_message: str = error.get("message", "")
        self.stored_traceback: str = error.get("traceback", "")
        # Not super().__init__: in a replay class (``_replay_class``) the next __init__
        # is the body's own exception's, whose arguments are its own.
        Exception.__init__(self, message or f"{self.exc_type}: {self.exc_message}")
        self.details: dict[str, Any] = {}

    @classmethod
    def from_record(cls, error: dict[str, Any] | None) -> StoredFailure:
        error = error or {}
        alone = f"{error.get('type', 'Exception')}: {error.get('message', '')}"
        original = _loaded_class(error)
        if original is None or issubclass(original, StoredFailure):
            return cls(alone, error)
        try:
            exc = _replay_class(cls, original)(error.get("message", ""), error)
        except (TypeError, ValueError):
            # The two classes' layouts cannot be combined, or the original's __new__
            # wants its own arguments (ExceptionGroup): the stored failure alone.
            return cls(alone, error)
        stored_args = error.get("args")
        exc.args = tuple(stored_args) if isinstance(stored_args, list) else (exc.exc_message,)
        return exc


#: Per (StoredFailure class, original class) the class a replay of it is raised as: one
#: class each, so that two replays of the same failure are of the same type.
_REPLAY_CLASSES: dict[tuple[type, type], type] = {}


def _loaded_class(error: dict[str, Any]) -> type[Exception] | None:
    """The stored error's exception class where its module is already imported (a stored
    record never makes this process import anything), else None."""
    module = sys.modules.get(str(error.get("module") or ""))
    found = getattr(module, str(error.get("type") or ""), None) if module else None
    if isinstance(found, type) and issubclass(found, Exception):
        return found
    return None


def _replay_class(cls: type[StoredFailure], original: type[Exception]) -> type:
    replay_class = _REPLAY_CLASSES.get((cls, original))
    if replay_class is None:
        replay_class = type(original.__name__, (cls, original), {
            "__module__": original.__module__,
            "__qualname__": original.__qualname__,
            "__doc__": cls.__doc__,
            # The original's own __str__ may read attributes its __init__ set, which a
            # replay never ran: its text is the stored one.
            "__str__": lambda self: self.exc_message,
            # Pickled by reference, the class would resolve to the original one.
            "__reduce__": lambda self: (_replayed, (cls, {
                "type": original.__name__, "module": original.__module__,
                "message": self.exc_message, "traceback": self.stored_traceback,
                "args": list(self.args)})),
        })
        _REPLAY_CLASSES[(cls, original)] = replay_class
    return replay_class


def _replayed(cls: type[StoredFailure], error: dict[str, Any]) -> StoredFailure:
    return cls.from_record(error)


class LeaseLost(IdempotencyError):
    """The lease is gone or a newer holder has it: this holder's token is fenced out."""


class InvalidLease(IdempotencyError, ValueError):
    """A lease needs a non-empty name and holder that fit their columns and seconds > 0."""


class PersistenceError(IdempotencyError):
    """The job database could not be read or written; the body did not run unclaimed."""


class ConnectionLost(PersistenceError):
    """The body's database connection was lost: its attempt was handed back, not failed
    (released, or UNCERTAIN or dead-lettered by the task's declarations), and the message
    comes back to run again or to meet that outcome."""


class NotMigrated(PersistenceError, ConfigurationError):
    """The job tables do not exist on the job database: ``manage.py migrate`` was not run
    there. A worker treats it as any persistence error (the message waits and comes back,
    so a deploy that migrates a moment later loses nothing)."""


class Expired(StoredFailure):
    """The job's message expired before any worker claimed it (state EXPIRED). A
    duplicate gets this error; an operator's retry sends it again without its expiry."""


class Undeliverable(StoredFailure):
    """The job's message could not be delivered: no worker claimed it after
    ``CELERY_IDEM_MAX_REDISPATCHES`` re-sends, or its stored message cannot be decoded."""


class Uncertain(IdempotencyError):
    """The job's outcome is not known: its worker was lost during the body of a task that
    must not re-run blindly (state UNCERTAIN), and an operator decides whether it
    succeeded or runs again. How a Django task's result reports that state."""


class IntentMissing(IdempotencyError):
    """A message carries an idempotency key whose intent does not exist (it rolled back
    with its transaction, or was forgotten): the worker refuses to run it."""


__all__ = [
    "ArgumentsNotJSON",
    "ClaimError",
    "ClaimLost",
    "ConfigurationError",
    "Expired",
    "IdempotencyError",
    "IntentMissing",
    "InProgress",
    "InvalidKey",
    "InvalidLease",
    "InvalidTransition",
    "KeyMismatch",
    "LeaseLost",
    "MissingKey",
    "NotMigrated",
    "PersistenceError",
    "ReservedAttribute",
    "ResultNotJSON",
    "StepNotJSON",
    "InvalidStep",
    "StoredFailure",
    "Uncertain",
    "Undeliverable",
]

