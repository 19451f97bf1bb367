"""celery_idem.testing: users' own tests run idempotent tasks in memory, no database."""

from __future__ import annotations

import pytest
from celery import shared_task

from celery_idem import IdempotentTask, StoredFailure
from celery_idem.errors import ArgumentsNotJSON
from celery_idem.testing import InMemoryBackend, use_backend


@shared_task(base=IdempotentTask, bind=True, idempotency_key="mem/{n}", name="tests.mem")
def remember(self, n):
    calls.append((n, self.attempt))
    seen_keys.append(self.request.idempotency_key)
    return {"n": n, "attempt": self.attempt}


@shared_task(base=IdempotentTask, bind=True, idempotency_key="memfail/{n}",
             name="tests.memfail")
def refuse(self, n):
    raise ValueError(f"no {n}")


calls: list[tuple[int, int]] = []
seen_keys: list[str | None] = []


@pytest.fixture(autouse=True)
def fresh_calls():
    calls.clear()


def test_eager_duplicates_replay_from_memory():
    """Two eager runs of one key: one body call, the same result, the job in memory."""
    with use_backend(InMemoryBackend()) as store:
        first = remember.apply(args=(7,)).get()
        second = remember.apply(args=(7,)).get()
    assert first == second == {"n": 7, "attempt": 1}
    assert calls == [(7, 1)]
    job = store.job("mem/7")
    assert (job.state, job.attempt) == ("SUCCEEDED", 1)
    assert job.started_at is not None and job.finished_at is not None
    assert store.events("mem/7") == []  # the happy path and a replay record no history


def test_a_stored_failure_is_replayed():
    """The key failed once; a duplicate re-raises the stored failure without running."""
    with use_backend(InMemoryBackend()) as store:
        with pytest.raises(ValueError):
            refuse.apply(args=(1,), throw=True)
        with pytest.raises(StoredFailure, match="no 1") as replayed:
            refuse.apply(args=(1,), throw=True)
    assert isinstance(replayed.value, ValueError)
    assert store.job("memfail/1").state == "FAILED"


def test_the_switch_ends_with_the_block():
    """Outside the block the library is back on its own backend."""
    from celery_idem.backends import _override, get_backend

    store = InMemoryBackend()
    with use_backend(store):
        assert get_backend("default") is store
    assert not _override


def test_delay_in_eager_mode_runs_once_per_key():
    """CELERY_TASK_ALWAYS_EAGER (the README's "Testing your tasks"): delay() runs the
    body in the caller, once per key; a duplicate replays the stored result."""
    from celery import current_app

    current_app.conf.task_always_eager = True
    try:
        with use_backend(InMemoryBackend()) as store:
            first = remember.delay(8).get()
            second = remember.delay(8).get()
    finally:
        current_app.conf.task_always_eager = False
    assert first == second == {"n": 8, "attempt": 1}
    assert calls == [(8, 1)]
    assert store.job("mem/8").state == "SUCCEEDED"


def test_calling_the_function_directly_bypasses_idempotency():
    """A direct call is a plain function call: no claim, no job, the body runs each time."""
    with use_backend(InMemoryBackend()) as store:
        assert remember(9) == remember(9) == {"n": 9, "attempt": None}
        assert store.jobs == {}
    assert calls == [(9, None), (9, None)]


def test_a_direct_call_whose_arguments_make_no_key_runs_without_one():
    """Celery calls a ``link_error`` errback's task directly in the failing task's worker,
    with whatever arguments its signature holds: a direct call claims nothing, so
    arguments that could not be stored (bytes) run the body, which sees no key; a publish
    of them is still refused."""
    with use_backend(InMemoryBackend()) as store:
        assert remember(b"raw") == {"n": b"raw", "attempt": None}
        assert seen_keys[-1] is None
        remember(9)
        assert seen_keys[-1] == "mem/9"
        with pytest.raises(ArgumentsNotJSON):
            remember.delay(b"raw")
        assert store.jobs == {}
