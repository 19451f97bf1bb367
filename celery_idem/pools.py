"""What the worker's pool does for celery-idem: only prefork enforces hard time limits."""

from __future__ import annotations

from typing import Any

#: Whether this process's pool kills a body at its hard time limit: only prefork does
#: (solo, threads and gevent ignore time limits), so only there may the time limit set
#: the lease. Recorded when the worker starts; prefork children inherit it.
_pool_enforces_time_limits = False


def note_pool(sender: Any = None, **_: Any) -> None:
    """``worker_init`` receiver: record whether the worker's pool enforces time limits."""
    global _pool_enforces_time_limits
    _pool_enforces_time_limits = is_prefork(sender)


def is_prefork(worker: Any) -> bool:
    """Whether ``worker`` (the ``worker_init`` sender) runs its tasks in forked children."""
    from celery.concurrency import get_implementation
    from celery.concurrency.prefork import TaskPool

    pool = getattr(worker, "pool_cls", None)
    if isinstance(pool, str):
        pool = get_implementation(pool)
    return isinstance(pool, type) and issubclass(pool, TaskPool)


def time_limits_enforced() -> bool:
    """Whether a hard time limit ends a body in this process (see ``note_pool``)."""
    return _pool_enforces_time_limits
