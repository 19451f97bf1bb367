"""Body of one producer process that enqueues a Django task in the race of
tests/integration/test_django_tasks.py (started with multiprocessing spawn)."""

from __future__ import annotations

import os


def enqueue(env: dict[str, str], order_id: int, barrier, results, rounds: int) -> None:
    os.environ.update(env)
    import django

    django.setup()
    from django_app.effects.django_tasks import ship

    for _ in range(rounds):
        barrier.wait(timeout=120)
        result = ship.enqueue(order_id, hold=0.5)
        results.put((os.getpid(), result.id))
