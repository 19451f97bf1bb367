"""Run the whole test suite, tier by tier: ``python3 tests/run.py``.

On a fresh machine it first makes ``.venv`` and installs the project with its test
extras. First the static checks (ruff, mypy on the library, ``makemigrations --check``
for the test project and the demo's shop),
each counted as one test; then the tiers (pytest runs, each with its own database,
broker and queue):

1. sqlite: no services: unit tests, database tests on SQLite (the model test included),
   the admin in a real browser, and real worker processes on the filesystem transport
   (the demo small among them).
2. postgres+redis: database tests on PostgreSQL (the model test included), workers on
   Redis (the demo small among them), every benchmark at a tiny size (so the scripts in
   bench/ cannot rot), and the chaos suite small.
3. postgres+rabbitmq: workers on RabbitMQ, and the chaos suite small.
4. pgbouncer+redis: behind a PgBouncer of its own in transaction pooling mode
   (tests/services/pgbouncer.py, started for the tier and stopped after): the worker
   tests of duplicates, replays, atomic mode, the outbox, recovery and crashes on prefork
   and gevent, and the recovery pass's database tests; with ``IDEM_FULL_MATRIX=1`` more
   worker tests, on every pool. Needs Debian's ``pgbouncer`` (.ci/run installs it).

Tiers 2 and 3 need PostgreSQL, Redis and RabbitMQ on 127.0.0.1. Without them they are
skipped, except in CI (``CI=true``), where a missing service fails the run.
Extra arguments go to every pytest run, e.g. ``python3 tests/run.py -k claim -x``.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bootstrap", ROOT / "django_app" / "bootstrap.py")
assert _spec and _spec.loader
_bootstrap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bootstrap)
sys.path.insert(0, str(ROOT))
from tests.services import pgbouncer  # noqa: E402  (standard library only at import)

REDIS = "redis://127.0.0.1:6379"
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"
SERVICES = {"postgres": 5432, "redis": 6379, "rabbitmq": 5672}
#: (name, environment, test paths, services it needs)
TIERS = [
    ("sqlite", {"IDEM_DATABASE": "sqlite"},
     ["tests/unit", "tests/db", "tests/browser", "tests/integration"], []),
    ("postgres+redis", {"IDEM_DATABASE": "postgres", "IDEM_BROKER": f"{REDIS}/0",
                        "IDEM_RESULTS": f"{REDIS}/1"},
     ["tests/db", "tests/integration", "tests/bench", "tests/chaos"],
     ["postgres", "redis", "rabbitmq"]),
    ("postgres+rabbitmq", {"IDEM_DATABASE": "postgres", "IDEM_BROKER": RABBITMQ,
                           "IDEM_RESULTS": f"{REDIS}/1"}, ["tests/integration", "tests/chaos"],
     ["postgres", "rabbitmq", "redis"]),
]
#: The pgbouncer+redis tier's tests: what CI runs, and what IDEM_FULL_MATRIX=1 adds.
PGBOUNCER_TESTS = [f"tests/integration/test_{name}.py" for name in (
    "pooler", "duplicates", "outbox", "recovery", "handback", "steps", "worker_connections")
] + [f"tests/db/test_{name}.py" for name in (
    "reaper", "reaper_beat", "reaper_hooks", "envelope_recovery", "handback_paths")]
PGBOUNCER_FULL_TESTS = [f"tests/integration/test_{name}.py" for name in (
    "envelope", "call_paths", "publish_paths", "beat")]
TIERS.append(
    ("pgbouncer+redis", {"IDEM_DATABASE": "postgres", "IDEM_BROKER": f"{REDIS}/0",
                         "IDEM_RESULTS": f"{REDIS}/1"},
     PGBOUNCER_TESTS + (PGBOUNCER_FULL_TESTS if os.environ.get("IDEM_FULL_MATRIX") == "1"
                        else []),
     ["postgres", "redis", "pgbouncer"]))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: The static checks: (name, command). Each fails the run when it fails.
CHECKS = [
    ("ruff", ["-m", "ruff", "check", "celery_idem", "tests", "bench", "django_app",
              "example_project"]),
    ("mypy", ["-m", "mypy"]),
    ("migrations", ["-m", "django", "makemigrations", "--check", "--dry-run",
                    "--settings=django_app.settings"]),
    # The demo's shop (example_project/) is a project of its own, with its own settings.
    ("shop migrations", ["-m", "django", "makemigrations", "--check", "--dry-run",
                         "--pythonpath=example_project", "--settings=shop.settings"]),
]


def _missing(services: list[str]) -> list[str]:
    missing = []
    for name in services:
        if name == "pgbouncer":  # a binary: the tier starts its own
            if pgbouncer.binary() is None:
                missing.append("pgbouncer (not installed: apt-get install pgbouncer)")
            continue
        try:
            socket.create_connection(("127.0.0.1", SERVICES[name]), timeout=2).close()
        except OSError:
            missing.append(name)
    return missing


@contextmanager
def _server(services: list[str]) -> Iterator[dict[str, str]]:
    """A server the tier starts for itself (a PgBouncer), and the environment it needs."""
    if "pgbouncer" not in services:
        yield {}
        return
    with pgbouncer.running() as bouncer:
        yield pgbouncer.environment(bouncer)


def _counts(junit: Path) -> tuple[int, int, int]:
    if not junit.exists():
        return 0, 0, 0
    suites = ET.parse(junit).getroot().iter("testsuite")
    tests = failed = skipped = 0
    for suite in suites:
        tests += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return tests - failed - skipped, failed, skipped


def _checks(workdir: Path) -> tuple[int, int]:
    """Run the static checks; (passed, failed)."""
    passed = failed = 0
    for name, args in CHECKS:
        print(f"\n=== check {name} ===", flush=True)
        env = {**os.environ, "IDEM_VAR_DIR": str(workdir / "checks"),
               "SHOP_VAR": str(workdir / "checks-shop")}
        if subprocess.call([sys.executable, *args], cwd=ROOT, env=env) == 0:
            passed += 1
        else:
            failed += 1
            print(f"check {name} FAILED", flush=True)
    return passed, failed


def main(argv: list[str]) -> int:
    _bootstrap.ensure_venv("test,bench")
    run_id = uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix=f"celery-idem-{run_id}-"))
    passed, failed = _checks(workdir)
    totals = [passed, failed, 0]
    exit_code = 1 if failed else 0
    for name, env_extra, paths, services in TIERS:
        print(f"\n=== tier {name} ===", flush=True)
        missing = _missing(services)
        if missing and not IN_CI:
            print(f"skipped: {', '.join(missing)} not reachable on 127.0.0.1 "
                  "(in CI this fails the run)", flush=True)
            continue
        junit = workdir / f"{name}.xml"
        with _server(services) as server_env:
            env = {
                **os.environ, **env_extra, **server_env,
                "IDEM_VAR_DIR": str(workdir / name),
                "IDEM_QUEUE": f"idem-test-{run_id}-{name}", "IDEM_PG_NAME": f"idem_{run_id}",
            }
            code = subprocess.call(
                [sys.executable, "-m", "pytest", *paths, f"--junitxml={junit}",
                 "-p", "no:cacheprovider", *argv], cwd=ROOT, env=env)
        passed, failed, skipped = _counts(junit)
        totals = [totals[0] + passed, totals[1] + failed, totals[2] + skipped]
        if code not in (0, 5):
            exit_code = 1
    print(f"\ntotal: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    if totals[0] == 0:
        exit_code = exit_code or 1
    return exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
