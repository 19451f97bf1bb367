"""The chaos suite's rule for the non-idempotent effect: a repeat is acceptable only when
a fault hit that execution while it ran (checks.counter_repeats)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.chaos.checks import counter_repeats
from tests.chaos.faults import Fault


def _runs(path: Path, *runs: tuple[str, int, int, float]) -> Path:
    path.write_text("".join(json.dumps({"key": k, "attempt": a, "pid": p, "t": t}) + "\n"
                            for k, a, p, t in runs))
    return path


def test_a_repeat_counts_only_when_a_fault_hit_that_execution_while_it_ran(tmp_path):
    path = _runs(tmp_path / "counter.log",
                 ("killed", 1, 10, 100.0), ("killed", 2, 11, 105.0),
                 ("restarted", 1, 20, 100.0), ("restarted", 2, 21, 105.0),
                 ("other-pid", 1, 30, 100.0), ("other-pid", 2, 31, 105.0),
                 ("too-early", 1, 40, 100.0), ("too-early", 2, 41, 105.0),
                 ("too-late", 1, 50, 100.0), ("too-late", 2, 51, 105.0),
                 ("once", 1, 60, 100.0))
    faults = [Fault("kill_child", 102.0, [10]), Fault("pg_restart", 50.0),
              Fault("kill_worker", 102.0, [999, 998]), Fault("kill_child", 99.0, [40]),
              Fault("zombie", 106.0, [50]), Fault("redis_restart", 103.0, [], {})]
    # The redis restart at 103 hits every process: it explains "restarted" (and the
    # others whose first run spans it), so leave it out to test the pid rule alone.
    repeats, by_kind, unexplained, missing = counter_repeats(
        path, ["killed", "restarted", "other-pid", "too-early", "too-late", "once", "never"],
        {k: 2 for k in ("killed", "restarted", "other-pid", "too-early", "too-late")}
        | {"once": 1}, faults[:5])
    assert repeats == 5
    assert by_kind == {"kill_child": 1}
    assert [u.split(":")[0] for u in unexplained] == [
        "restarted", "other-pid", "too-early", "too-late"]
    assert missing == ["never"]
    repeats, by_kind, unexplained, _ = counter_repeats(
        path, ["restarted"], {"restarted": 2}, faults)
    assert (repeats, dict(by_kind), unexplained) == (1, {"redis_restart": 1}, [])


def test_two_executions_of_one_attempt_are_never_explained(tmp_path):
    """A claim's attempt runs its body once: two lines of the committed attempt mean the
    fencing failed, whatever faults struck."""
    path = _runs(tmp_path / "counter.log", ("twice", 1, 10, 100.0), ("twice", 1, 11, 101.0))
    _, _, unexplained, _ = counter_repeats(path, ["twice"], {"twice": 1},
                                           [Fault("pg_restart", 100.5)])
    assert unexplained and "2 executions of the committed attempt" in unexplained[0]


def test_an_outage_explains_the_executions_alive_while_it_lasted(tmp_path):
    """Behind PgBouncer a PostgreSQL restart leaves the database unreachable for as long
    as PgBouncer refuses logins (``server_login_retry``): an execution that started just
    after the restart began may not reach it for its commit within its lease, and its
    repeat is that fault's. One that started once the database answered again is not."""
    path = _runs(tmp_path / "counter.log",
                 ("during", 1, 10, 101.0), ("during", 2, 11, 116.0),
                 ("after", 1, 20, 115.5), ("after", 2, 21, 130.0))
    outage = Fault("pg_restart", 100.0, until=115.0)
    repeats, by_kind, unexplained, _ = counter_repeats(
        path, ["during", "after"], {"during": 2, "after": 2}, [outage])
    assert repeats == 2
    assert by_kind == {"pg_restart": 1}
    assert [u.split(":")[0] for u in unexplained] == ["after"]
