"""Test helpers for projects that use celery-idem: an in-memory job store and a switch.

For example:

    from celery_idem.testing import InMemoryBackend, use_backend

    def test_ship_once():
        with use_backend(InMemoryBackend()) as store:
            ship_order.apply(args=(42,))          # eager: claims and commits in memory
            ship_order.apply(args=(42,))          # a duplicate replays the stored result
            assert store.job("ship/42").state == "SUCCEEDED"

``use_backend`` switches the job store for the whole library (producer, worker runner,
recovery, operator actions) until the block ends. ``InMemoryBackend`` keeps jobs and
their history in dicts of this process: no database, no migrations. It renders the same
moves as the database backends (the contract tests run all three), so the state
machine, fencing and replay behave as in production. ``atomic=True`` tasks still open a
transaction on the job database, so they need a database even here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from . import backends
from .backends.base import Backend
from .backends.memory import HistoryLine, InMemoryBackend, MemoryJob


@contextmanager
def use_backend(backend: Backend) -> Iterator[Backend]:
    """Make ``backend`` the job store of the whole library inside the block."""
    backends.override(backend)
    try:
        yield backend
    finally:
        backends.override(None)


__all__ = ["HistoryLine", "InMemoryBackend", "MemoryJob", "use_backend"]
