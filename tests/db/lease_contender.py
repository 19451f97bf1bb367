"""Body of one contender process in the lease race (started with multiprocessing spawn)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta


def contend(env: dict[str, str], kind: str, start: str, barrier, results, rounds: int) -> None:
    os.environ.update(env)
    import django

    django.setup()
    from django.utils import timezone

    from celery_idem import leases

    if kind == "portable":
        leases._sql = lambda using: leases.PORTABLE
    # Round n happens at start + n * 100 s and leases last 50 s, so every round finds the
    # last round's lease expired and all contenders race to take it over.
    clock = [datetime.fromisoformat(start)]
    timezone.now = lambda: clock[0]
    for n in range(rounds):
        clock[0] = datetime.fromisoformat(start) + timedelta(seconds=100 * n)
        barrier.wait(timeout=120)
        lease = leases.acquire("race", f"pid-{os.getpid()}", 50)
        results.put((n, os.getpid(), lease.token if lease else None))


def acquire_once(env: dict[str, str], kind: str, now: str, results) -> None:
    """Acquire lease ``tenant/1`` for holder ``b`` at the clock ``now``; report its token."""
    os.environ.update(env)
    import django

    django.setup()
    from django.utils import timezone

    from celery_idem import leases

    if kind == "portable":
        leases._sql = lambda using: leases.PORTABLE
    timezone.now = lambda: datetime.fromisoformat(now)
    lease = leases.acquire("tenant/1", "b", 10)
    results.put(lease.token if lease else None)
