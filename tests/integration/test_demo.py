"""The README's demo, run small: the shop under fire ends with every check passed.

Runs ``example_project/demo.py`` as a user would (its own worker processes, beat and fake
payment provider), on the tier's stack: the embedded default (SQLite + filesystem
transport) on the sqlite tier, PostgreSQL + Redis on the postgres+redis tier (a database
and queue of its own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.conf import settings

from tests.conftest import require_service

ROOT = Path(__file__).resolve().parents[2]
ORDERS, KILLS = 40, 1
#: Every line of the summary that is a check (the others are figures).
CHECKS = {
    "orders rolled back (no trace)", "jobs succeeded",
    "charges at the provider", "e-mails, repeats matched to kills",
    "stock deductions (atomic)", "shipments (upserts run)",
    "steps stored (ocr / index)", "OCR runs, repeats matched to kills",
    "coordinator writes in token order", "histories legal (path_errors)",
}


def _stack(tmp_path: Path) -> list[str]:
    """The demo's --database/--broker/--queue/--var for this tier."""
    broker = urlparse(settings.CELERY_BROKER_URL).scheme
    if settings.DATABASE_KIND == "sqlite" and broker == "filesystem":
        return ["--var", str(tmp_path / "var")]
    if settings.DATABASE_KIND == "postgres" and broker == "redis":
        require_service("postgres")
        require_service("redis")
        name = f"{os.environ.get('IDEM_PG_NAME', 'idem')}_shopdemo"
        return ["--database", f"postgres://postgres@127.0.0.1:5432/{name}",
                "--broker", settings.CELERY_BROKER_URL,
                "--queue", f"{settings.CELERY_TASK_DEFAULT_QUEUE}-shopdemo",
                "--var", str(tmp_path / "var")]
    pytest.skip("the demo runs in CI on the embedded default and on PostgreSQL + Redis; "
                "on RabbitMQ it is run by hand (it takes a minute a tier)")


def _drop_database(args: list[str]) -> None:
    """The PostgreSQL database the demo made for itself, dropped after the run."""
    if "--database" not in args:
        return
    import psycopg

    name = urlparse(args[args.index("--database") + 1]).path.lstrip("/")
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres",
                         autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_demo_passes_every_check_with_a_worker_killed(tmp_path):
    summary_file = tmp_path / "summary.json"
    args = [sys.executable, str(ROOT / "example_project" / "demo.py"),
            "--orders", str(ORDERS), "--kills", str(KILLS), "--seed", "7",
            "--json", str(summary_file), *_stack(tmp_path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IDEM_", "CELERY_"))}
    env["PYTHONPATH"] = str(ROOT)
    try:
        done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
    finally:
        _drop_database(args)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "every check passed" in output, output
    summary = json.loads(summary_file.read_text())
    assert {name for name, line in summary.items() if line["ok"] is not None} == CHECKS
    assert all(summary[name]["ok"] for name in CHECKS), summary
    assert summary["crashes (whole-worker SIGKILL)"]["value"] == str(KILLS)
    committed = int(summary["orders committed"]["value"])
    assert summary["jobs succeeded"]["value"] == f"{5 * committed} of {5 * committed}"
    assert int(summary["messages published by the shop"]["value"]) >= 2 * 5 * committed
