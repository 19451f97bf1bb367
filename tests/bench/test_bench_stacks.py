"""The benchmarks on the stacks of ``--database`` (bench/stacks.py) other than PostgreSQL
directly: behind a PgBouncer of the run's own, and on MariaDB, at a tiny size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import IN_CI

from .scripts import ROOT, run

pytestmark = pytest.mark.skipif(
    settings.DATABASE_KIND != "postgres", reason="benchmarks run on PostgreSQL only")


def test_honest_and_publish_batch_on_a_stack(stack_env, tmp_path):
    """``--database``: every variant on that stack (the layout floors of every stack too),
    the plain task its baseline; behind PgBouncer the workload goes through it (its
    transactions counted, its CPU a group of its own) and the WAL is still read; on MariaDB
    the server's CPU is a group, WAL n/a. The report and the stacks' figure render from the
    files, and no PgBouncer is left."""
    stack, env = stack_env
    data = run(env, tmp_path, "honest.py", "--database", stack, "--n", "8", "--rounds", "1",
               "--brokers", "redis", "--variants",
               "django,floor-django,floor-intent,floor-bare,floor-bare-broker,floor-wide,idem,"
               "pub-plain,pub-idem,pub-floor",
               timeout=180)
    assert data["settings"]["database"] == stack
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
    batch = run(env, tmp_path, "publish_batch.py", "--database", stack, "--n", "10",
                "--rounds", "1")
    assert batch["database"] == stack
    assert batch["results"]["batch: publish_many(group)"]["intent_statements_per_batch"] == 1

    other = tmp_path / "postgres.json"  # a second file: the comparison table and figure
    other.write_text(json.dumps({**data, "settings": {**data["settings"],
                                                      "database": "postgres"}}))
    files = [str(other), str(tmp_path / "honest.json")]
    proc = subprocess.run([sys.executable, "bench/report.py", *files], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| redis: × plain, same stack and round | PostgreSQL |" in proc.stdout
    if not IN_CI:
        pytest.importorskip("matplotlib")
    png = tmp_path / "stacks.png"
    proc = subprocess.run([sys.executable, "bench/plot.py", "--stacks", *files, "--targets",
                           "0.8,0.85", "--output", str(png)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert png.stat().st_size > 1000


def test_cpu_profile_on_a_stack(stack_env, tmp_path):
    """``--database``: both loops on that stack (MariaDB through the library's MySQL
    backend, PostgreSQL through a PgBouncer of the run's own), every effect written once."""
    stack, env = stack_env
    data = run(env, tmp_path, "cpu_profile.py", "--database", stack, "--n", "10",
               "--rounds", "1", timeout=180)
    assert data["settings"]["database"] == stack
    assert all(m["cpu_us"] > 0 for m in data["median"].values())
    assert set(data["ratios"]) == {"publish", "task"}
