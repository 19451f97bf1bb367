"""Run one contender function in many OS processes at once and collect what they report."""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.db import connection


def race(contend: Callable[..., None], processes: int, rounds: int, *args: Any,
         timeout: float = 180) -> list[Any]:
    """Start ``processes`` spawned processes running ``contend(env, *args, barrier,
    results, rounds)`` on this test's database; return the ``processes * rounds`` items
    they put on ``results`` (a missing one fails the test)."""
    env = {"IDEM_DB_NAME": str(connection.settings_dict["NAME"]),
           "IDEM_DATABASE": settings.DATABASE_KIND,
           "DJANGO_SETTINGS_MODULE": "django_app.settings"}
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=contend, args=(env, *args, barrier, results, rounds))
             for _ in range(processes)]
    for p in procs:
        p.start()
    outcomes: list[Any] = []
    try:
        for _ in range(processes * rounds):
            outcomes.append(results.get(timeout=timeout))
    except queue.Empty:
        pytest.fail(f"only {len(outcomes)} of {processes * rounds} outcomes reported")
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return outcomes
