"""Run the test suite tier by tier: ``python3 tests/run.py`` (what CI runs).

On a fresh machine it first makes ``.venv`` and installs the project with its ``test``
extra and those of the tiers it runs (``extras``; ``--help`` and ``--list`` install
nothing): the checks and the unit tests need no C library and no server. The static
checks come first (ruff, mypy on the library, ``makemigrations --check`` for the test
project and for the demo's shop, each counted as one test), then the tiers: each a
pytest run with its own database, broker, queue and temporary folder (``--list`` shows
them). A tier whose services are not listening on 127.0.0.1 is skipped, except in CI
(``CI=true``), where it fails the run. Arguments the runner does not know go to every
pytest run, e.g. ``python3 tests/run.py --tier sqlite -k claim -x``.

The tiers are two lanes run at once (``tests/tiers.py``, ``Tier.beside``), each one tier
after the other: the unit tests, PostgreSQL + Redis, PostgreSQL + RabbitMQ, MariaDB on
PyMySQL, Celery's suite and the wheel in the first; SQLite, MariaDB + Redis, the oldest
and newest stacks and PgBouncer beside them. A tier never meets another on a database (each
has its own: ``tier_environment``), a queue or a server port, nor the other lane's on a
Redis database, and the machine's two cores are busy instead of one. The first lane's output
streams; the other's is printed when the run ends. ``--serial`` runs every tier in one lane.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# tests/tiers.py: this script's folder is the first on sys.path.
from tiers import CHECKS, CHECKS_TIER, IN_CI, ROOT, SERVICES, TIERS, Tier


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
    parser.add_argument("--serial", action="store_true",
                        help="every tier one after the other (default: two lanes at once, "
                             "tests/tiers.py's Tier.beside)")
    return parser.parse_known_args(argv)


def selected(args: argparse.Namespace) -> tuple[bool, list[Tier]]:
    """Whether to run the static checks, and the tiers to run, in order."""
    if args.tier:
        return CHECKS_TIER in args.tier, [t for t in TIERS if t.name in args.tier]
    return True, [t for t in TIERS if args.full or not t.full_only]


def extras(tiers: list[Tier], checks: bool = False) -> str:
    """The project's extras ``.venv`` needs to run ``tiers`` (and the checks, which build
    the docs site): ``test`` and each tier's own (``Tier.extras``; a tier with a venv of
    its own, ``Tier.stack``, installs into that one)."""
    own = {extra for tier in tiers if not tier.stack for extra in tier.extras}
    if checks:
        own.add("docs")
    return ",".join(["test", *sorted(own)])


def list_tiers() -> None:
    print(f"{CHECKS_TIER:20} ruff, mypy, makemigrations --check (test project, demo shop), "
          "mkdocs build --strict")
    for tier in TIERS:
        needs = f" [needs {', '.join(tier.services)}]" if tier.services else ""
        full = " (only with --full)" if tier.full_only else ""
        beside = " (in the second lane)" if tier.beside else ""
        print(f"{tier.name:20} {tier.about}{needs}{full}{beside}")


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
               "SHOP_VAR": str(workdir / "checks-shop"), "NO_MKDOCS_2_WARNING": "1"}
        args = [arg.format(workdir=workdir) for arg in args]
        if subprocess.call([sys.executable, *args], cwd=ROOT, env=env) == 0:
            passed += 1
        else:
            failed += 1
            print(f"check {name} FAILED", flush=True)
    return passed, failed


def run_tier(tier: Tier, workdir: Path, run_id: str, env: dict[str, str],
             pytest_args: list[str], full: bool,
             output: IO[str] | None = None) -> tuple[int, int, int, bool]:
    """One tier's pytest run, its output to ``output`` (None: this process's):
    (passed, failed, skipped, ok)."""
    python = sys.executable
    if tier.stack:
        import venvs  # tests/venvs.py, beside this file

        try:
            python = str(venvs.ensure(tier.stack))
        except (SystemExit, subprocess.CalledProcessError) as exc:
            # As a missing service: a failure in CI, skipped elsewhere.
            print(f"cannot make .venv-{tier.stack}: {exc}"
                  f"{'' if IN_CI else ' (skipped; in CI this fails the run)'}", flush=True,
                  file=output)
            return 0, int(IN_CI), 0, not IN_CI
    junit = workdir / f"{tier.name}.xml"
    paths = [*tier.paths, *(tier.full_paths if full else ())]
    markers = ["-m", tier.markers] if tier.markers and not full else []
    with _server(tier.server) as server_env:
        code = subprocess.call(
            [python, "-m", "pytest", *paths, *markers, f"--junitxml={junit}",
             "-p", "no:cacheprovider", *pytest_args], cwd=ROOT, stdout=output,
            stderr=None if output is None else subprocess.STDOUT,
            env={**env, **tier.env, **server_env, **tier_environment(tier, workdir, run_id)})
    passed, failed, skipped = _counts(junit)
    # 5: no test collected (e.g. -k matched nothing in this tier), not a failure.
    return passed, failed, skipped, code in (0, 5)


def tier_environment(tier: Tier, workdir: Path, run_id: str) -> dict[str, str]:
    """What is one tier's own in a run: its folder, queue and database names (the two
    lanes' tiers run at once on the same PostgreSQL and MariaDB servers)."""
    name = f"idem_{run_id}_{re.sub(r'[^a-z0-9]+', '_', tier.name)}"
    return {"IDEM_VAR_DIR": str(workdir / tier.name),
            "IDEM_QUEUE": f"idem-test-{run_id}-{tier.name}",
            "IDEM_PG_NAME": name, "IDEM_MYSQL_NAME": name}


@contextmanager
def _server(name: str | None) -> Iterator[dict[str, str]]:
    """The server a tier starts for itself, and the environment that points at it."""
    if name is None:
        yield {}
        return
    from services import pgbouncer  # tests/services/, beside this file

    with pgbouncer.running() as bouncer:
        yield pgbouncer.environment(bouncer)


@dataclass(frozen=True)
class Outcome:
    tier: Tier
    counts: tuple[int, int, int]  # passed, failed, skipped
    ok: bool
    minutes: float
    log: Path | None  # its output, when it was not streamed


def run_lane(tiers: list[Tier], workdir: Path, run_id: str, env: dict[str, str],
             pytest_args: list[str], full: bool, streamed: bool) -> list[Outcome]:
    """Run ``tiers`` one after the other; their output streamed, or each into a file
    (``Outcome.log``) and one line said when it ends."""
    outcomes = []
    for tier in tiers:
        began = time.monotonic()
        log = None if streamed else workdir / f"{tier.name}.log"
        with open(log, "w") if log else nullcontext() as output:
            print(f"\n=== tier {tier.name} ===", flush=True, file=output)
            missing = _missing(tier)
            if missing and not IN_CI:
                print(f"skipped: {', '.join(missing)} not reachable on 127.0.0.1 "
                      "(in CI this fails the run)", flush=True, file=output)
                passed, failed, skipped, ok = 0, 0, 0, True
            else:
                passed, failed, skipped, ok = run_tier(tier, workdir, run_id, env,
                                                       pytest_args, full, output)
        outcome = Outcome(tier, (passed, failed, skipped), ok,
                          (time.monotonic() - began) / 60, log)
        print(f"\n{'--- beside: ' if log else ''}tier {tier.name}: {passed} passed, "
              f"{failed} failed, {skipped} skipped in {outcome.minutes:.1f} min"
              f"{' (its output is printed at the end)' if log else ''}", flush=True)
        outcomes.append(outcome)
    return outcomes


def lanes(tiers: list[Tier], serial: bool) -> tuple[list[Tier], list[Tier]]:
    """The tiers of the streamed lane, and those run beside it (``Tier.beside``)."""
    if serial:
        return tiers, []
    return [t for t in tiers if not t.beside], [t for t in tiers if t.beside]


def main(argv: list[str]) -> int:
    args, pytest_args = parse(argv)
    if args.list:
        list_tiers()
        return 0
    with_checks, tiers = selected(args)
    _bootstrap().ensure_venv(extras(tiers, with_checks))
    env = dict(os.environ)
    if args.full:
        env["IDEM_FULL_MATRIX"] = "1"
    run_id = uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix=f"celery-idem-{run_id}-"))
    passed, failed = run_checks(workdir) if with_checks else (0, 0)
    streamed, beside = lanes(tiers, args.serial)
    beside_outcomes: list[Outcome] = []
    errors: list[BaseException] = []

    def second_lane() -> None:
        try:
            beside_outcomes.extend(run_lane(beside, workdir, run_id, env, pytest_args,
                                            args.full, streamed=False))
        except BaseException as exc:  # re-raised by the main thread
            errors.append(exc)

    thread = threading.Thread(target=second_lane, name="beside", daemon=True)
    thread.start()
    outcomes = run_lane(streamed, workdir, run_id, env, pytest_args, args.full, streamed=True)
    thread.join()
    if errors:
        raise errors[0]
    for outcome in beside_outcomes:
        assert outcome.log is not None
        print(outcome.log.read_text(errors="replace"), flush=True)
    outcomes += beside_outcomes
    totals = [passed, failed, 0]
    for outcome in outcomes:
        totals = [total + count for total, count in zip(totals, outcome.counts, strict=True)]
    print(f"\ntotal: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 0 if not failed and all(o.ok for o in outcomes) and totals[0] else 1


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
