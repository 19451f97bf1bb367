"""Every benchmark in bench/ runs end to end at a tiny size, so the scripts cannot rot.

The numbers come from full runs (docs/benchmarks.md); this only checks that each command
works and writes its results. It needs PostgreSQL, Redis and RabbitMQ (the stacks of
``--database``, MariaDB and Debian's pgbouncer binary too: test_bench_stacks.py): it runs
in the postgres tiers, skips in the SQLite tier, and in CI a missing service fails it.
Each module gets its own throwaway database (``idem_bench_smoke_*``, conftest.py),
dropped after.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings

from tests.conftest import IN_CI

from .scripts import ROOT, run

pytestmark = pytest.mark.skipif(
    settings.DATABASE_KIND != "postgres", reason="benchmarks run on PostgreSQL only")


def _once_available() -> bool:
    try:
        import celery_once  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail("celery-once is not installed (the bench extra)", pytrace=False)
        return False
    return True


def test_throughput_every_variant_and_broker(bench_env, tmp_path):
    variants = "plain,once,idem,atomic,replay3,replay" if _once_available() \
        else "plain,idem,atomic,replay3,replay"
    data = run(bench_env, tmp_path, "throughput.py", "--n", "15", "--rounds", "1",
               "--brokers", "redis", "--variants", variants)
    assert all(r["exactly_once"] for r in data["runs"])
    assert set(data["summary"]["redis"]) == set(variants.split(","))
    data = run(bench_env, tmp_path, "throughput.py", "--n", "15", "--rounds", "1",
               "--brokers", "rabbitmq", "--variants",
               "plain,atomic:reuse,idem:hygienic,replay:hygienic+prepared+rodup")
    assert data["summary"]["rabbitmq"]["atomic:reuse"]["median_ratio"] > 0

    if not IN_CI:
        pytest.importorskip("matplotlib")
    png = tmp_path / "plot.png"
    proc = subprocess.run([sys.executable, "bench/plot.py", "--input",
                           str(tmp_path / "throughput.json"), "--output", str(png)],
                          cwd=ROOT, env=bench_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert png.stat().st_size > 1000


def test_protocol_cost(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "protocol_cost.py", "--iterations", "10", "--rounds", "1")
    paths = data["paths"]
    assert paths["publish (producer intent)"]["round_trips"] == 1
    assert paths["fresh run (default)"]["protocol_round_trips"] >= 2
    assert data["timings"]["median_us"]["plugin claim+commit"] > 0


def test_scaling(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "scaling.py", "--sizes", "300,600", "--ops", "10",
               "--batches", "1", "--stale", "10")
    assert [r["size"] for r in data["results"]] == [300, 600]
    assert data["results"][-1]["claim_explain"]["indexes"]
    assert data["results"][-1]["recovery"]["stale_pass_sending_ms"] > 0


def test_memory(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "memory.py", "--n", "30")
    assert data["summary"]["idem"]["median_rss_after_total_kib"] > 0


def test_filesystem_loss(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "filesystem_loss.py", "--n", "50", "--rounds", "1")
    assert data["summary"]["celery_idem"] == {"sent": 50, "lost": 0}
    assert data["summary"]["kombu"]["sent"] == 50


def test_honest(bench_env, tmp_path):
    """Every variant on Redis (``atomic1``: the one-statement prototype, bench/onestmt.py;
    ``floor-bare``, ``floor-wide``, ``floor-split``, ``floor-split-hot``: the library's
    statements in raw SQL on candidate layouts of the job row, bench/layouts_sql.py;
    ``*-broker``: CELERY_IDEM_DURABILITY = "broker", no intent written at publish;
    ``floor-intent``, ``pub-floor``: the floor's intent written at publish);
    on RabbitMQ the raw app and the fixup's policy (a session per task); the table prints
    from the results file."""
    variants = ("raw,django,once,floor,floor-django,floor-intent,idem,idem-broker,atomic,"
                "atomic1,replay,replay-sent,pub-plain,pub-idem,pub-async,pub-broker,pub-floor,"
                "floor-bare,floor-bare-broker,floor-wide,floor-split,floor-split-hot")
    if not _once_available():
        variants = variants.replace("once,", "")
    data = run(bench_env, tmp_path, "honest.py", "--n", "8", "--rounds", "1",
               "--brokers", "redis", "--variants", variants, timeout=180)
    assert all(r["exactly_once"] for r in data["runs"])
    assert set(data["summary"]["redis"]) == set(variants.split(","))
    idem = next(r for r in data["runs"] if r["variant"] == "idem")
    # the replays of finished keys whose results nobody reads send no message, unless
    # told to as a replay someone sees would (replay-sent)
    sent = {r["variant"]: r["messages_per_publish"] for r in data["runs"]}
    assert (sent["replay"], sent["replay-sent"], sent["idem"]) == (0, 1, 1)
    # nothing written at publish (an intent is ~1.8 kB of WAL)
    assert (next(r for r in data["runs"] if r["variant"] == "pub-broker")[
        "wal_bytes_per_task"] or 0) < 100
    # the floor's intent is written at publish
    assert next(r for r in data["runs"] if r["variant"] == "pub-floor")[
        "wal_bytes_per_task"] > 0
    assert set(idem["cpu_us_per_task"]) == {"producer", "worker", "postgres", "broker"}
    assert (idem["wal_bytes_per_task"] or idem["wal_bytes_per_task_cluster"]) > 0
    # the "keep" policy: the Django workers opened no session per task
    assert idem["pg_sessions_per_task"] < 1
    data = run(bench_env, tmp_path, "honest.py", "--n", "8", "--rounds", "1",
               "--brokers", "rabbitmq", "--variants", "raw,django:celery")
    assert data["summary"]["rabbitmq"]["django:celery"]["median_ratio_to_raw"] > 0
    fixup = next(r for r in data["runs"] if r["variant"] == "django:celery")
    assert fixup["policy"] == "celery" and fixup["pg_sessions_per_task"] >= 1
    proc = subprocess.run([sys.executable, "bench/honest.py", "--print",
                           str(tmp_path / "honest.json")], cwd=ROOT, env=bench_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "rabbitmq" in proc.stdout, proc.stderr[-3000:]
    # docs/benchmarks.md's tables, rendered from the same file
    proc = subprocess.run([sys.executable, "bench/report.py", str(tmp_path / "honest.json")],
                          cwd=ROOT, env=bench_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| rabbitmq | tasks/s | × django |" in proc.stdout
    assert "| raw (psycopg, kept connection) |" in proc.stdout


def test_envelope_cost(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "envelope_cost.py", "--n", "10", "--rounds", "1")
    results = data["results"]
    assert results["envelope"]["statements_per_publish"] == 1
    assert results["before (no envelope)"]["avg_message_bytes"] == 0
    assert results["envelope + link/errback"]["avg_message_bytes"] > \
        results["envelope"]["avg_message_bytes"] > 0


def test_wal_breakdown(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "wal_breakdown.py", "--n", "5")
    if data["idem"].get("records") == 0:
        pytest.skip("pg_walinspect read no records (PostgreSQL < 15?)")
    statements = data["idem"]["by_statement"]
    assert set(statements) == {"intent", "claim", "body", "commit"}
    assert all(v["bytes"] > 0 for v in statements.values())
    assert set(data["plain"]["by_statement"]) == {"body"}


def test_wal_layouts(bench_env, tmp_path):
    """Each layout's bookkeeping measured; a claim and a commit on the narrow table without
    indexes are HOT, so they log less than on today's table."""
    data = run(bench_env, tmp_path, "wal_layouts.py", "--n", "5", "--orders", "interleaved",
               "--layouts", "current,split_hot")
    layouts = data["layouts"]
    if layouts["current/interleaved"].get("records") == 0:
        pytest.skip("pg_walinspect read no records (PostgreSQL < 15?)")

    def moves(name: str) -> float:
        return sum(layouts[f"{name}/interleaved"]["by_statement"][s]["bytes"]
                   - layouts[f"{name}/interleaved"]["by_statement"][s]["fpi"]
                   for s in ("claim", "commit"))
    assert moves("split_hot") < moves("current")


def test_cpu_profile(bench_env, tmp_path):
    """Every loop measured, both ratios reported; --profile prints the profile's table."""
    data = run(bench_env, tmp_path, "cpu_profile.py", "--n", "10", "--rounds", "1",
               "--profile", "publish-idem", "--top", "5")
    assert set(data["median"]) == {"publish-plain", "publish-idem", "task-plain", "task-idem"}
    assert all(m["cpu_us"] > 0 for m in data["median"].values())
    assert set(data["ratios"]) == {"publish", "task"}
    data = run(bench_env, tmp_path, "cpu_profile.py", "--n", "10", "--rounds", "1",
               "--durability", "broker")
    assert data["settings"]["durability"] == "broker"
    assert all(m["cpu_us"] > 0 for m in data["median"].values())


def test_session_cost(bench_env, tmp_path):
    """Every variant and loop measured, each with its ratio to the default and the
    server's CPU beside this process's."""
    data = run(bench_env, tmp_path, "session_cost.py", "--n", "5", "--rounds", "1")
    assert set(data["summary"]) == {"default", "no-routines", "prepared", "flushed",
                                    "prepared+flushed"}
    assert all(set(kinds) == {"plain", "atomic"} and all(
        s["ratio_to_default"] > 0 and s["server_cpu_us"] >= 0 for s in kinds.values())
               for kinds in data["summary"].values())
    assert data["summary"]["default"]["plain"]["ratio_to_default"] == 1


def test_publish_batch(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "publish_batch.py", "--n", "10", "--rounds", "1")
    results = data["results"]
    assert results["batch: publish_many(group)"]["intent_statements_per_batch"] == 1
    assert results["batch in atomic()"]["intent_statements_per_batch"] == 1
    assert results["one at a time"]["intent_statements_per_batch"] == 10


def test_scale(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "scale.py", "--rows", "4000", "--unknown", "20",
               "--repeat", "1")
    assert data["table"]["jobs"] == 4020
    assert data["recovery"]["unknown_task_claims_pass"]["did"] == {"skipped": 20}
    assert data["recovery"]["nothing_to_do_pass"]["did"] == {}
    assert {"default", "exact"} <= set(data["idem_status"])
    assert {"list", "dead-lettered=no", "state=SUCCEEDED", "detail"} <= set(data["admin"])
    assert data["idem_purge"]["deleted_jobs"] > 0 and data["idem_purge"]["inserts"] > 0
