"""Every suite of ``python -m bench`` runs end to end at a tiny size, so none can rot.

The numbers come from full runs (bench/baselines/); this only checks that each suite works
and writes its results file. It needs PostgreSQL, Redis and RabbitMQ (the other stacks,
MariaDB and Debian's pgbouncer binary too: test_bench_stacks.py): it runs in the
postgres tiers, skips in the SQLite tier, and in CI a missing service fails it. Each
module gets its own throwaway database (``idem_bench_smoke_*``, conftest.py), dropped
after.
"""

from __future__ import annotations

import json

import pytest
from django.conf import settings

from bench.suites import SUITES
from bench.suites.counts import PATHS as COUNTED
from tests.conftest import IN_CI
from tests.integration.conftest import FULL_MATRIX

from .runner import bench, run

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


def test_list_names_every_suite_and_its_question(bench_env):
    out = bench(bench_env, "list")
    assert [line.split()[0] for line in out.splitlines() if not line.startswith(" ")] \
        == list(SUITES)


def test_end_to_end(bench_env, tmp_path):
    """The variants on Redis, every one with --full (``floor-bare``, ``floor-wide``,
    ``floor-split``, ``floor-split-hot``: the library's statements in raw SQL on candidate
    layouts of the job row, bench/lib/layouts_sql.py; ``*-broker``: CELERY_IDEM_DURABILITY
    = "broker", no intent written at publish; ``floor-intent``, ``pub-floor``: the floor's
    intent written at publish; ``django-real``, ``idem-real``: the realistic body, its
    overheads against its own plain twin, and every run's latency one task at a time); on
    RabbitMQ the raw app and the fixup's policy (a session per task); the report renders
    from the results file."""
    # Each variant starts its own workers (a few seconds each): CI runs those the
    # assertions below read and one of each family; --full runs every one.
    variants = ("raw,django,floor,idem,idem-broker,atomic,replay,replay-sent,pub-plain,"
                "pub-idem,pub-broker,pub-floor,floor-split,django-real,idem-real")
    if FULL_MATRIX:
        variants += (",floor-django,floor-intent,pub-async,floor-bare,floor-bare-broker,"
                     "floor-wide,floor-split-hot")
        if _once_available():
            variants += ",once"
    data = run(bench_env, tmp_path, "end-to-end", "--n", "8", "--rounds", "1",
               "--broker", "redis", "--variants", variants, timeout=600)
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
    real = data["summary"]["redis"]["idem-real"]
    assert real["median_latency_ms"] > 0 and real["median_overhead_cpu_us"] is not None
    assert data["summary"]["redis"]["django-real"]["overhead_cpu_us"] == []  # its own twin
    data = run(bench_env, tmp_path, "end-to-end", "--n", "8", "--rounds", "1",
               "--broker", "rabbitmq", "--variants", "raw,django:celery")
    assert data["summary"]["rabbitmq"]["django:celery"]["median_ratio_to_raw"] > 0
    fixup = next(r for r in data["runs"] if r["variant"] == "django:celery")
    assert fixup["policy"] == "celery" and fixup["pg_sessions_per_task"] >= 1
    out = bench(bench_env, "report", str(tmp_path / "end-to-end.json"))
    assert "| rabbitmq | tasks/s | × django | × floor |" in out
    assert "| raw (psycopg, kept connection) |" in out


def test_publishing(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "publishing", "--n", "10", "--rounds", "1")
    results = data["results"]
    assert results["batch: publish_many(group)"]["intent_statements_per_batch"] == 1
    assert results["batch in atomic()"]["intent_statements_per_batch"] == 1
    assert results["one at a time"]["intent_statements_per_batch"] == 10


def test_statements(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "statements", "--n", "10", "--rounds", "1")
    paths = data["paths"]
    assert paths["publish (producer intent)"]["round_trips"] == 1
    assert paths["fresh run (default)"]["protocol_round_trips"] >= 2
    assert data["timings"]["median_us"]["plugin claim+commit"] > 0


def test_cpu(bench_env, tmp_path):
    """Every loop measured, both ratios reported; the suite's own --profile prints the
    profile's table; --durability broker runs the idempotent loops without the intent."""
    data = run(bench_env, tmp_path, "cpu", "--n", "10", "--rounds", "1",
               "--", "--profile", "publish-idem", "--top", "5")
    assert set(data["median"]) == {"publish-plain", "publish-idem", "task-plain", "task-idem"}
    assert all(m["cpu_us"] > 0 for m in data["median"].values())
    assert set(data["ratios"]) == {"publish", "task"}
    data = run(bench_env, tmp_path, "cpu", "--n", "10", "--rounds", "1",
               "--", "--durability", "broker")
    assert data["settings"]["durability"] == "broker"
    assert all(m["cpu_us"] > 0 for m in data["median"].values())


def test_wal(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "wal", "--n", "5")
    if data["idem"].get("records") == 0:
        pytest.skip("pg_walinspect read no records (PostgreSQL < 15?)")
    statements = data["idem"]["by_statement"]
    assert set(statements) == {"intent", "claim", "body", "commit"}
    assert all(v["bytes"] > 0 for v in statements.values())
    assert set(data["plain"]["by_statement"]) == {"body"}


def test_scaling(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "scaling", "--quick")
    assert [r["size"] for r in data["results"]] == [1000, 2000]
    assert data["results"][-1]["claim_explain"]["indexes"]
    assert data["results"][-1]["recovery"]["stale_pass_sending_ms"] > 0


def test_scale(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "scale", "--quick")
    assert data["table"]["jobs"] == 4020
    assert data["recovery"]["unknown_task_claims_pass"]["did"] == {"skipped": 20}
    assert data["recovery"]["nothing_to_do_pass"]["did"] == {}
    assert {"default", "exact"} <= set(data["idem_status"])
    assert {"list", "dead-lettered=no", "state=SUCCEEDED", "detail"} <= set(data["admin"])
    assert data["idem_purge"]["deleted_jobs"] > 0 and data["idem_purge"]["inserts"] > 0


def test_memory(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "memory", "--n", "30")
    assert data["summary"]["idem"]["median_rss_after_total_kib"] > 0


def test_broker_loss(bench_env, tmp_path):
    data = run(bench_env, tmp_path, "broker-loss", "--n", "50", "--rounds", "1")
    assert data["summary"]["celery_idem"] == {"sent": 50, "lost": 0}
    assert data["summary"]["kombu"]["sent"] == 50



def test_counts(bench_env, tmp_path):
    """Every path counted on PostgreSQL, and under callgrind its instructions against its
    plain twin and the floor of its own statements; the table printed (its figures are
    pinned by tests/db/test_counts.py)."""
    out = tmp_path / "counts.json"
    printed = bench(bench_env, "run", "counts", "--n", "2", "--out", str(out),
                    "--", "--instructions-n", "3", timeout=600)
    data = json.loads(out.read_text())
    paths = data["stacks"]["postgres"]["paths"]
    assert set(paths) == set(COUNTED)
    assert paths["task"]["commits"] > paths["task, plain"]["commits"]
    assert paths["task"]["extra_instructions"] > 0 and paths["task"]["floor_instructions"] > 0
    assert "own_instructions" in paths["publish"]
    assert "task, atomic=True" in printed and "instr/op" in printed


def test_the_baselines_table_and_figure(bench_env, tmp_path):
    """``report`` prints the committed baselines' table; ``plot`` draws it."""
    assert "| a fresh task (IdempotentTask) |" in bench(bench_env, "report")
    if not IN_CI:
        pytest.importorskip("matplotlib")
    png = tmp_path / "baselines.png"
    bench(bench_env, "plot", "--out", str(png))
    assert png.stat().st_size > 1000
