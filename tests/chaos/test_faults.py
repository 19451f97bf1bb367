"""The chaos suite's fault plan: every kind of fault must strike once (or as often as the
run asks), so one that found no target at its moments tries again after the plan, on a
job published for it when every child is idle (tests/chaos/faults.py)."""

from __future__ import annotations

import json
import random
import signal
import subprocess

from tests.chaos import faults
from tests.chaos.faults import Fault, Injector


class IdleFleet(Injector):
    """An injector whose zombie finds no busy child for its first ``idle`` looks (every
    worker idle), then one; nothing else is touched."""

    def __init__(self, idle: int, required: int = 1) -> None:
        super().__init__([(0.0, "zombie")], random.Random(1), None, None, None, None,  # type: ignore[arg-type]
                         1.0, "q", lambda: [], self.publish_target,
                         required={"zombie": required})
        self.idle = idle
        self.looks = 0
        self.targets: list[tuple[int, str]] = []  # (looks so far, kind) per target published

    def publish_target(self, kind: str) -> str:
        self.targets.append((self.looks, kind))
        return f"chaos/{kind}/{len(self.targets)}"

    def _busy(self, kinds: tuple[str, ...]) -> list:
        return []

    def zombie(self) -> Fault | None:
        self.looks += 1
        return None if self.looks <= self.idle else Fault("zombie", 0.0, [self.looks])


def test_a_fault_with_no_target_at_its_moment_strikes_after_the_plan():
    injector = IdleFleet(idle=faults.TRIES)
    injector.run()
    assert [f.kind for f in injector.faults] == ["zombie"]
    assert injector.skipped == ["zombie"]  # reported as skipped at its moment
    assert injector.looks == faults.TRIES + 1
    # At its moment the run's own jobs are the targets; after the plan it gets one of its own.
    assert injector.targets == [(faults.TRIES, faults.BUSY_KINDS["zombie"][-1])]


def test_a_fault_that_never_finds_a_target_is_left_missing():
    injector = IdleFleet(idle=faults.TRIES + faults.LATE_TRIES)
    injector.run()
    assert injector.faults == []
    assert injector.looks == faults.TRIES + faults.LATE_TRIES
    assert [looks for looks, _ in injector.targets] == list(
        range(faults.TRIES, faults.TRIES + faults.LATE_TRIES))


def test_a_kind_short_of_its_required_count_strikes_again_until_it_is_not():
    injector = IdleFleet(idle=faults.TRIES, required=3)
    injector.run()
    assert [f.kind for f in injector.faults] == ["zombie"] * 3
    assert injector.shortfalls() == {}
    assert injector.looks == faults.TRIES + 3  # the plan's moment found none, then 3 late


def test_options_raise_the_planned_counts_and_never_lower_them():
    plain = faults.fault_counts(60, redis=True)
    assert (plain["kill_child"], plain["kill_worker"], plain["zombie"]) == (7, 2, 1)
    assert "pgbouncer_kill" not in plain
    counts = faults.fault_counts(60, redis=True, pooler=True,
                                 at_least={**faults.kills(50), "zombie": 0, "redis_restart": 2})
    assert (counts["kill_child"], counts["kill_worker"]) == (40, 10)  # 50 SIGKILLs
    assert counts["zombie"] == 1 and counts["redis_restart"] == 2
    assert counts["pgbouncer_restart"] == counts["pgbouncer_kill"] == 1
    plan = faults.schedule(random.Random(1), 60, counts)
    assert sorted(kind for _, kind in plan) == sorted(
        kind for kind, n in counts.items() for _ in range(n))
    assert all(6 <= at <= 54 for at, _ in plan)


class Children:
    """A fleet whose pool children are ``sleep`` processes this test starts."""

    def __init__(self) -> None:
        self.pids: list[int] = []

    def children(self) -> list[int]:
        return self.pids


def test_a_key_struck_as_often_as_allowed_is_no_longer_a_target(tmp_path):
    (tmp_path / "running").mkdir()
    fleet = Children()
    injector = Injector([], random.Random(1), fleet, None, None, tmp_path,  # type: ignore[arg-type]
                        1.0, "q", lambda: [], lambda kind: "")

    def running(key: str) -> subprocess.Popen:
        child = subprocess.Popen(["sleep", "60"])
        fleet.pids.append(child.pid)
        (tmp_path / "running" / str(child.pid)).write_text(
            json.dumps({"key": key, "kind": "count", "attempt": 1}))
        return child

    for _ in range(faults.STRIKES_PER_KEY):
        child = running("chaos/count/1")
        fault = injector.kill_child()
        assert fault is not None and fault.pids == [child.pid]
        assert child.wait() == -signal.SIGKILL
    spared = running("chaos/count/1")
    assert injector._busy(faults.BUSY_KINDS["kill_child"]) == []
    other = running("chaos/count/2")
    assert [pid for pid, _ in injector._busy(faults.BUSY_KINDS["kill_child"])] == [other.pid]
    for child in (spared, other):
        child.kill()
        child.wait()
