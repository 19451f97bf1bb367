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
4. oldest and newest: the oldest supported Python, Django and Celery (3.11, 5.2, 5.5),
   then the newest (3.13, 6.1, 5.7), each in ``.venv-<name>`` made from pyenv's
   interpreter (tests/venvs.py): unit tests, the model test, the migrations check and
   the worker tests marked ``pools`` on PostgreSQL + Redis. ``tox`` runs the whole matrix.
5. wheel: the sdist and wheel built and checked, the wheel installed with its extras into
   a fresh virtualenv, and a project outside the checkout running a task on a real worker.

Tiers 2 to 5 need PostgreSQL, Redis and RabbitMQ on 127.0.0.1. Without them they are
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bootstrap", ROOT / "django_app" / "bootstrap.py")
assert _spec and _spec.loader
_bootstrap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bootstrap)
_venvs_spec = importlib.util.spec_from_file_location("venvs", ROOT / "tests" / "venvs.py")
assert _venvs_spec and _venvs_spec.loader
_venvs = importlib.util.module_from_spec(_venvs_spec)
sys.modules["venvs"] = _venvs  # its dataclass looks its module up there
_venvs_spec.loader.exec_module(_venvs)

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
    # The oldest and newest supported stack (tests/venvs.py, each in .venv-<name> made
    # from pyenv): unit tests, the model test and the worker tests marked ``pools`` on
    # every pool, on PostgreSQL + Redis. tox runs the whole matrix.
    ("oldest", {"IDEM_DATABASE": "postgres", "IDEM_BROKER": f"{REDIS}/0",
                "IDEM_RESULTS": f"{REDIS}/1"},
     ["tests/unit", "tests/db/test_model.py", "tests/integration", "-m", "pools or not worker"],
     ["postgres", "redis"]),
    ("newest", {"IDEM_DATABASE": "postgres", "IDEM_BROKER": f"{REDIS}/0",
                "IDEM_RESULTS": f"{REDIS}/1"},
     ["tests/unit", "tests/db/test_model.py", "tests/integration", "-m", "pools or not worker"],
     ["postgres", "redis"]),
    # The sdist and wheel built, checked, and the wheel installed into a fresh venv for a
    # project outside the checkout (tests/packaging).
    ("wheel", {}, ["tests/packaging"], ["postgres", "redis"]),
]
#: Tiers that run in a venv of their own (tests/venvs.py's stacks) instead of .venv.
TIER_VENVS = {"oldest": "oldest", "newest": "newest"}
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
        try:
            socket.create_connection(("127.0.0.1", SERVICES[name]), timeout=2).close()
        except OSError:
            missing.append(name)
    return missing


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
    _bootstrap.ensure_venv("test,bench,beat")
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
        python = sys.executable
        if name in TIER_VENVS:
            try:
                python = str(_venvs.ensure(TIER_VENVS[name]))
            except (SystemExit, subprocess.CalledProcessError) as exc:
                print(f"cannot make the {name} venv: {exc}", flush=True)
                if IN_CI:
                    totals[1] += 1
                    exit_code = 1
                continue
        junit = workdir / f"{name}.xml"
        env = {
            **os.environ, **env_extra,
            "IDEM_VAR_DIR": str(workdir / name), "IDEM_QUEUE": f"idem-test-{run_id}-{name}",
            "IDEM_PG_NAME": f"idem_{run_id}",
        }
        code = subprocess.call(
            [python, "-m", "pytest", *paths, f"--junitxml={junit}",
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
