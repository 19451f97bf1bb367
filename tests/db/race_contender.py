"""Body of one contender process in the claim race (started with multiprocessing spawn)."""

from __future__ import annotations

import os


def contend(env: dict[str, str], insert_first: bool, barrier, results, rounds: int) -> None:
    os.environ.update(env)
    import django

    django.setup()
    from celery_idem import claims
    from celery_idem.backends.values import Intent

    for n in range(rounds):
        intent = Intent(namespace="race", key=f"race-{n}", task_name="race", fingerprint="fp",
                        args=[n], kwargs={}, options={})
        barrier.wait(timeout=120)
        outcome, claim = claims.acquire(intent, worker=f"pid-{os.getpid()}",
                                        task_id=f"{os.getpid()}-{n}", lease_seconds=300,
                                        using="default", insert_first=insert_first)
        results.put((n, os.getpid(), claim is not None))
