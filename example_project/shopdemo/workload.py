"""The workload: orders placed in transactions, each task published more than once, and
whole workers SIGKILLed at random moments (each replaced at once)."""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field

from .processes import Fleet

SKUS = ["mug", "tee", "cap", "pin", "bag"]
STOCK = 100_000
TASKS_PER_ORDER = 5
#: In the transaction, each task is published this many times: both copies leave at the
#: commit, so the second usually meets the first one's attempt while it runs.
COPIES = 2
#: Orders placed ahead of the workers: enough to keep them busy, few enough that no
#: message waits in the queue past the (demo's short) dispatch timeout.
WINDOW = 8


@dataclass
class Workload:
    orders: int
    kills: int
    rng: random.Random
    committed: list[int] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # their e-mail addresses
    published: int = 0
    _again: deque[tuple[float, int]] = field(default_factory=deque)
    _kill_at: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Kills at random points of the run (as fractions of the jobs done), early
        # enough that every crashed claim is recovered before the end.
        self._kill_at = sorted(self.rng.uniform(0.1, 0.6) for _ in range(self.kills))

    @property
    def expected_jobs(self) -> int:
        return TASKS_PER_ORDER * (self.orders - self.orders // 25)

    def place_some(self, done_jobs: int) -> None:
        """Place orders until WINDOW orders are ahead of the workers; publish the late
        copies that are due."""
        from shop.orders import TASKS, OrderRefused, place_order, publish

        while len(self.committed) + len(self.refused) < self.orders \
                and len(self.committed) - done_jobs / TASKS_PER_ORDER < WINDOW:
            number = len(self.committed) + len(self.refused) + 1
            refuse = number % 25 == 0  # every 25th order fails validation and rolls back
            try:
                order_id = place_order(
                    tenant=self.rng.choice(["north", "south", "east"]),
                    email=f"customer{number}@example.com", sku=self.rng.choice(SKUS),
                    quantity=self.rng.randint(1, 3), total_cents=self.rng.randint(500, 9000),
                    copies=COPIES, refuse=refuse)
            except OrderRefused:
                self.refused.append(f"customer{number}@example.com")
                continue
            self.committed.append(order_id)
            self.published += COPIES * TASKS_PER_ORDER
            if self.rng.random() < 0.2:  # a customer who clicks again a moment later
                self._again.append((time.monotonic() + self.rng.uniform(0.2, 2), order_id))
        while self._again and self._again[0][0] <= time.monotonic():
            _, order_id = self._again.popleft()
            for task in TASKS:
                publish(task, order_id)
            self.published += TASKS_PER_ORDER

    def maybe_kill(self, fleet: Fleet, done_jobs: int) -> str | None:
        """SIGKILL a whole worker (preferably one running a claim) when the next kill is
        due, and start a replacement; returns the killed node."""
        from celery_idem.liveness import node_of
        from celery_idem.models import Job

        if not self._kill_at or done_jobs < self._kill_at[0] * self.expected_jobs:
            return None
        busy = {node_of(w) for w in Job.objects.filter(state="RUNNING")
                .values_list("worker", flat=True)}
        candidates = [n for n in fleet.alive() if n in busy]
        if not candidates:
            return None  # try again on the next tick, when some claim is running
        self._kill_at.pop(0)
        node = self.rng.choice(candidates)
        fleet.kill(node)
        fleet.start_worker()
        return node
