"""Run the test suite tier by tier: ``python3 tests/run.py`` (what CI runs).

On a fresh machine it first makes ``.venv`` and installs the project with its test
extras (``--help`` and ``--list`` install nothing). The static checks come first (ruff,
mypy on the library, ``makemigrations --check`` for the test project and for the demo's
shop, each counted as one test), then the tiers: each a pytest run with its own
database, broker, queue and temporary folder (``--list`` shows them). A tier whose
services are not listening on 127.0.0.1 is skipped, except in CI (``CI=true``), where it
fails the run. Arguments the runner does not know go to every pytest run, e.g.
``python3 tests/run.py --tier sqlite -k claim -x``.
"""

from __future__ import annotations

import argparse
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REDIS = "redis://127.0.0.1:6379"
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"
SERVICES = {"postgres": 5432, "redis": 6379, "rabbitmq": 5672, "mariadb": 3306}
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Tier:
    """One pytest run: what it tests, on which database and broker."""

    name: str
    about: str
    paths: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    services: tuple[str, ...] = ()
    #: Only with ``--full`` (or named with ``--tier``): the whole matrix, too slow for CI.
    full_only: bool = False
    #: Run in ``.venv-<stack>`` (tests/venvs.py: another Python, Django and Celery)
    #: instead of ``.venv``.
    stack: str | None = None
    #: A pytest ``-m`` expression: the subset of ``paths`` this tier runs (all of them
    #: with ``--full``).
    markers: str | None = None
    #: More test paths that only ``--full`` runs.
    full_paths: tuple[str, ...] = ()
    #: A server the tier starts for itself in front of the shared ones ("pgbouncer").
    server: str | None = None


POSTGRES = {"IDEM_DATABASE": "postgres"}
MARIADB = {"IDEM_DATABASE": "mysql"}
#: Worker tests of publishing, canvas, task options, beat, the leader and metrics: the
#: same celery-idem code whatever the database and broker (their SQL is in tests/db, run
#: on every database). CI runs them on PostgreSQL + Redis; --full on SQLite and MariaDB too.
SAME_ON_EVERY_STACK = tuple(f"tests/integration/test_{name}.py" for name in (
    "beat", "call_paths", "celery_published", "leader", "metrics", "publish_paths",
    "pydantic", "replace_check", "retry_arguments", "send_task_keys", "untyped"))
#: Worker tests of a prototype in bench/ (bench/onestmt.py), not of the library: --full.
PROTOTYPES = ("tests/integration/test_onestmt_prototype.py",)
#: The other worker tests: duplicates, crashes, recovery, the outbox, batches, the stored
#: message, large arguments, recipes, steps, and each database's own (the rest skip).
STACK_WORKER_TESTS = tuple(sorted(
    str(path.relative_to(ROOT)) for path in (ROOT / "tests" / "integration").glob("test_*.py")
    if str(path.relative_to(ROOT)) not in SAME_ON_EVERY_STACK + PROTOTYPES))
TIERS = [
    Tier("unit", "unit tests: no database, no services (the fastest useful subset)",
         ("tests/unit",)),
    Tier("sqlite", "SQLite (WAL) + celery-idem's filesystem transport: database tests, "
         "the admin in headless Chromium, the worker tests of duplicates, crashes, recovery, "
         "the outbox, batches and the stored message (the demo small among them; the "
         "worker tests that run the same code on every stack with --full)",
         ("tests/db", "tests/browser", *STACK_WORKER_TESTS), {"IDEM_DATABASE": "sqlite"},
         full_paths=SAME_ON_EVERY_STACK),
    Tier("postgres+redis", "PostgreSQL + Redis: database tests (native SQL and portable "
         "backends), real workers on every pool, every benchmark at a tiny size, the chaos "
         "suite small (the bench/ prototype's worker test with --full)",
         ("tests/db", *STACK_WORKER_TESTS, *SAME_ON_EVERY_STACK, "tests/bench", "tests/chaos"),
         {**POSTGRES, "IDEM_BROKER": f"{REDIS}/0", "IDEM_RESULTS": f"{REDIS}/1"},
         ("postgres", "redis", "rabbitmq"), full_paths=PROTOTYPES),
    Tier("postgres+rabbitmq", "PostgreSQL + RabbitMQ: the worker tests whose outcome rests "
         "on the broker (marked `pools` or `delivery`; all of them with --full), the chaos "
         "suite small", ("tests/integration", "tests/chaos"),
         {**POSTGRES, "IDEM_BROKER": RABBITMQ, "IDEM_RESULTS": f"{REDIS}/1"},
         ("postgres", "rabbitmq", "redis"), markers="pools or delivery or not worker"),
    Tier("mariadb+redis", "MariaDB (Django's mysql backend, mysqlclient) + Redis: the "
         "MySQL backend and the portable one, the migrations, the admin (in a browser too), "
         "the worker tests of duplicates, crashes, recovery, the outbox, batches and the "
         "stored message (the worker tests that run the same code on every stack with "
         "--full), the chaos suite small on a mariadbd of its own (Debian's mariadb-server "
         "binaries)",
         ("tests/db", "tests/browser", *STACK_WORKER_TESTS, "tests/chaos"),
         {**MARIADB, "IDEM_MYSQL_DRIVER": "mysqlclient", "IDEM_BROKER": f"{REDIS}/0",
          "IDEM_RESULTS": f"{REDIS}/1"}, ("mariadb", "redis"),
         full_paths=SAME_ON_EVERY_STACK),
    Tier("mariadb-pymysql", "MariaDB on the other driver, PyMySQL: the backend contract, "
         "the claims and their races",
         ("tests/db/test_backend_contract.py", "tests/db/test_claims.py",
          "tests/db/test_race.py", "tests/db/test_mysql.py"),
         {**MARIADB, "IDEM_MYSQL_DRIVER": "pymysql"}, ("mariadb",)),
    *(Tier(name, f"the {name} supported stack ({about}) in .venv-{name} (tests/venvs.py): "
           "unit tests, the model test, the migrations check and the worker tests marked "
           "`pools` on every pool, on PostgreSQL + Redis (tox runs the whole matrix)",
           ("tests/unit", "tests/db/test_model.py", "tests/integration"),
           {**POSTGRES, "IDEM_BROKER": f"{REDIS}/0", "IDEM_RESULTS": f"{REDIS}/1"},
           ("postgres", "redis"), stack=name, markers="pools or not worker")
      for name, about in [("oldest", "Python 3.11, Django 5.2, Celery 5.5"),
                          ("newest", "Python 3.13, Django 6.1, Celery 5.7")]),
    Tier("pgbouncer+redis", "PostgreSQL behind a PgBouncer of its own in transaction "
         "pooling mode (tests/services/pgbouncer.py; Debian's pgbouncer) + Redis: the worker "
         "tests of duplicates, replays, atomic mode, the outbox, batches, recovery and crashes on "
         "prefork and gevent, the recovery pass's database tests (more with --full)",
         tuple([f"tests/integration/test_{name}.py" for name in (
             "pooler", "duplicates", "outbox", "batching", "recovery", "handback", "steps",
             "worker_connections")] + [f"tests/db/test_{name}.py" for name in (
                 "reaper_stale_claims", "reaper_lost_messages", "reaper_passes",
                 "reaper_beat", "reaper_hooks", "envelope_recovery", "handback_paths")]),
         {**POSTGRES, "IDEM_BROKER": f"{REDIS}/0", "IDEM_RESULTS": f"{REDIS}/1"},
         ("postgres", "redis"), server="pgbouncer",
         full_paths=tuple(f"tests/integration/test_{name}.py" for name in (
             "envelope", "call_paths", "publish_paths", "beat"))),
    Tier("celery-compat", "Celery's own integration suite (test_tasks.py, test_canvas.py "
         "from the installed Celery's sdist, downloaded at test time) plain and with "
         "IdempotentTask as every task's base, once per key kind, compared per test "
         "against tests/compat/allowed.toml (its quick tests; all of them with --full)",
         ("tests/compat",), {**POSTGRES, "IDEM_BROKER": f"{REDIS}/12",
                             "IDEM_RESULTS": f"{REDIS}/13"}, ("postgres", "redis")),
    Tier("wheel", "the sdist and wheel built and checked, the wheel installed with its "
         "extras into a fresh virtualenv, a project outside the checkout set up as the "
         "README says on PostgreSQL, behind PgBouncer and on MariaDB: duplicates, a replay "
         "and a killed worker (tests/packaging)", ("tests/packaging",), {},
         ("postgres", "redis", "mariadb")),
]
#: The static checks: (name, command). Each counts as one test and fails the run when
#: it fails.
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
CHECKS_TIER = "checks"


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The runner's own options, and the rest for pytest."""
    names = [CHECKS_TIER, *(tier.name for tier in TIERS)]
    parser = argparse.ArgumentParser(
        prog="python3 tests/run.py", description=__doc__.split("\n\n")[0], allow_abbrev=False,
        epilog="Fastest useful subset: python3 tests/run.py --tier checks --tier unit. "
               "Every other argument goes to pytest.")
    parser.add_argument("--tier", action="append", choices=names, metavar="NAME",
                        help=f"run only this tier (repeatable): {', '.join(names)}")
    parser.add_argument("--full", action="store_true",
                        help="the whole matrix: every tier, every worker test on every "
                             "pool (IDEM_FULL_MATRIX=1); slow, for releases")
    parser.add_argument("--list", action="store_true", help="list the tiers and exit")
    return parser.parse_known_args(argv)


def selected(args: argparse.Namespace) -> tuple[bool, list[Tier]]:
    """Whether to run the static checks, and the tiers to run, in order."""
    if args.tier:
        return CHECKS_TIER in args.tier, [t for t in TIERS if t.name in args.tier]
    return True, [t for t in TIERS if args.full or not t.full_only]


def list_tiers() -> None:
    print(f"{CHECKS_TIER:20} ruff, mypy, makemigrations --check (test project, demo shop)")
    for tier in TIERS:
        needs = f" [needs {', '.join(tier.services)}]" if tier.services else ""
        full = " (only with --full)" if tier.full_only else ""
        print(f"{tier.name:20} {tier.about}{needs}{full}")


def _missing(tier: Tier) -> list[str]:
    missing = []
    if tier.server == "pgbouncer":
        from services import pgbouncer  # tests/services/, beside this file; stdlib only

        if pgbouncer.binary() is None:
            missing.append("pgbouncer (not installed: apt-get install pgbouncer)")
    for name in tier.services:
        try:
            socket.create_connection(("127.0.0.1", SERVICES[name]), timeout=2).close()
        except OSError:
            missing.append(name)
    return missing


def _counts(junit: Path) -> tuple[int, int, int]:
    if not junit.exists():
        return 0, 0, 0
    tests = failed = skipped = 0
    for suite in ET.parse(junit).getroot().iter("testsuite"):
        tests += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return tests - failed - skipped, failed, skipped


def run_checks(workdir: Path) -> tuple[int, int]:
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


def run_tier(tier: Tier, workdir: Path, run_id: str, env: dict[str, str],
             pytest_args: list[str], full: bool) -> tuple[int, int, int, bool]:
    """One tier's pytest run: (passed, failed, skipped, ok)."""
    python = sys.executable
    if tier.stack:
        import venvs  # tests/venvs.py, beside this file

        try:
            python = str(venvs.ensure(tier.stack))
        except (SystemExit, subprocess.CalledProcessError) as exc:
            # As a missing service: a failure in CI, skipped elsewhere.
            print(f"cannot make .venv-{tier.stack}: {exc}"
                  f"{'' if IN_CI else ' (skipped; in CI this fails the run)'}", flush=True)
            return 0, int(IN_CI), 0, not IN_CI
    junit = workdir / f"{tier.name}.xml"
    paths = [*tier.paths, *(tier.full_paths if full else ())]
    markers = ["-m", tier.markers] if tier.markers and not full else []
    with _server(tier.server) as server_env:
        code = subprocess.call(
            [python, "-m", "pytest", *paths, *markers, f"--junitxml={junit}",
             "-p", "no:cacheprovider", *pytest_args], cwd=ROOT, env={
                **env, **tier.env, **server_env,
                "IDEM_VAR_DIR": str(workdir / tier.name),
                "IDEM_QUEUE": f"idem-test-{run_id}-{tier.name}",
                "IDEM_PG_NAME": f"idem_{run_id}", "IDEM_MYSQL_NAME": f"idem_{run_id}",
            })
    passed, failed, skipped = _counts(junit)
    # 5: no test collected (e.g. -k matched nothing in this tier), not a failure.
    return passed, failed, skipped, code in (0, 5)


@contextmanager
def _server(name: str | None) -> Iterator[dict[str, str]]:
    """The server a tier starts for itself, and the environment that points at it."""
    if name is None:
        yield {}
        return
    from services import pgbouncer  # tests/services/, beside this file

    with pgbouncer.running() as bouncer:
        yield pgbouncer.environment(bouncer)


def main(argv: list[str]) -> int:
    args, pytest_args = parse(argv)
    if args.list:
        list_tiers()
        return 0
    _bootstrap().ensure_venv("test,bench,beat")
    with_checks, tiers = selected(args)
    env = dict(os.environ)
    if args.full:
        env["IDEM_FULL_MATRIX"] = "1"
    run_id = uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix=f"celery-idem-{run_id}-"))
    passed, failed = run_checks(workdir) if with_checks else (0, 0)
    totals = [passed, failed, 0]
    ok = not failed
    for tier in tiers:
        print(f"\n=== tier {tier.name} ===", flush=True)
        missing = _missing(tier)
        if missing and not IN_CI:
            print(f"skipped: {', '.join(missing)} not reachable on 127.0.0.1 "
                  "(in CI this fails the run)", flush=True)
            continue
        *counts, tier_ok = run_tier(tier, workdir, run_id, env, pytest_args, args.full)
        totals = [total + count for total, count in zip(totals, counts, strict=True)]
        ok = ok and tier_ok
    print(f"\ntotal: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 0 if ok and totals[0] else 1


def _bootstrap():  # noqa: ANN202 - a module loaded by path
    """django_app/bootstrap.py, loaded by path: the package imports Celery, which a fresh
    machine does not have yet."""
    spec = importlib.util.spec_from_file_location(
        "bootstrap", ROOT / "django_app" / "bootstrap.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
