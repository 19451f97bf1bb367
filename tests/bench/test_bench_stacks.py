"""The suites on the stacks of ``--stack`` (bench/lib/stacks.py) other than PostgreSQL
directly: behind a PgBouncer of the run's own, and on MariaDB, at a tiny size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import IN_CI

from .runner import bench, run

pytestmark = pytest.mark.skipif(
    settings.DATABASE_KIND != "postgres", reason="benchmarks run on PostgreSQL only")


def test_end_to_end_and_publishing_on_a_stack(stack_env, tmp_path):
    """``--stack``: every variant on that stack (the layout floors of every stack too),
    the plain task its baseline; behind PgBouncer the workload goes through it (its
    transactions counted, its CPU a group of its own) and the WAL is still read; on MariaDB
    the server's CPU is a group, WAL n/a. The report and the stacks' figure render from the
    files, and no PgBouncer is left."""
    stack, env = stack_env
    data = run(env, tmp_path, "end-to-end", "--stack", stack, "--n", "8", "--rounds", "1",
               "--broker", "redis", "--variants",
               "django,floor-django,floor-intent,floor-bare,floor-bare-broker,floor-wide,idem,"
               "pub-plain,pub-idem,pub-floor",
               timeout=180)
    assert data["stack"] == data["settings"]["database"] == stack
    assert all(r["exactly_once"] and r["database"] == stack for r in data["runs"])
    idem = data["summary"]["redis"]["idem"]
    assert idem["median_ratio_to_django"] > 0
    run_idem = next(r for r in data["runs"] if r["variant"] == "idem")
    if stack == "pgbouncer":
        assert set(run_idem["cpu_us_per_task"]) == {"producer", "worker", "postgres",
                                                    "pgbouncer", "broker"}
        assert run_idem["pooler_transactions_per_task"] >= 1  # claim, body, commit at least
        assert run_idem["wal_bytes_per_task_cluster"] > 0
        assert data["environment"]["stack"]["pgbouncer"]["pool_mode"] == "transaction"
        pid = data["environment"]["stack"]["pgbouncer"]["pid"]
        comm = Path(f"/proc/{pid}/comm")  # the run's own PgBouncer was stopped
        assert not comm.exists() or comm.read_text().strip() != "pgbouncer"
    else:
        assert set(run_idem["cpu_us_per_task"]) == {"producer", "worker", "mariadb", "broker"}
        assert run_idem["wal_bytes_per_task"] is None and run_idem["pg_sessions_per_task"] is None
        assert data["environment"]["stack"]["mariadb"]["version"]
    batch = run(env, tmp_path, "publishing", "--stack", stack, "--n", "10", "--rounds", "1")
    assert batch["stack"] == batch["database"] == stack
    assert batch["results"]["batch: publish_many(group)"]["intent_statements_per_batch"] == 1

    other = tmp_path / "postgres.json"  # a second file: the comparison table and figure
    other.write_text(json.dumps({**data, "settings": {**data["settings"],
                                                      "database": "postgres"}}))
    files = [str(other), str(tmp_path / "end-to-end.json")]
    out = bench(env, "report", *files)
    assert "| redis: × plain, same stack and round | PostgreSQL |" in out
    if not IN_CI:
        pytest.importorskip("matplotlib")
    png = tmp_path / "stacks.png"
    bench(env, "plot", *files, "--targets", "0.8", "0.85", "--out", str(png))
    assert png.stat().st_size > 1000


def test_cpu_on_a_stack(stack_env, tmp_path):
    """``--stack``: both loops on that stack (MariaDB through the library's MySQL
    backend, PostgreSQL through a PgBouncer of the run's own), every effect written once."""
    stack, env = stack_env
    data = run(env, tmp_path, "cpu", "--stack", stack, "--n", "10", "--rounds", "1",
               timeout=180)
    assert data["settings"]["database"] == stack
    assert all(m["cpu_us"] > 0 for m in data["median"].values())
    assert set(data["ratios"]) == {"publish", "task"}


def test_counts_on_a_stack(stack_env, tmp_path):
    """The counts on that stack (no callgrind pass: the PostgreSQL smoke test runs it),
    and SQLite's beside it, in one run."""
    stack, env = stack_env
    data = run(env, tmp_path, "counts", "--stack", stack, "--n", "2",
               "--", "--stacks", f"{stack},sqlite", "--no-instructions", timeout=300)
    assert set(data["stacks"]) == {stack, "sqlite"}
    for counted in data["stacks"].values():
        assert counted["paths"]["task"]["commits"] == 3
        assert counted["paths"]["publish, plain"]["statements"] == 0
