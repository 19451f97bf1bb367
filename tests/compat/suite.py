"""Celery's own integration suite, run plain and with ``IdempotentTask`` as every task's
base (tests/compat/plugin.py), one run per key kind; each run's outcome per test.

The suite comes from the sdist of the installed Celery, downloaded at test time with pip
into a cache (``IDEM_COMPAT_CACHE``, default ``~/.cache/celery-idem``) and extracted into
the run's folder: nothing of it is committed. Each run is a pytest process in a copy of
its own against the shared Redis (databases 12 and 13) under a key prefix of its own
(Celery's ``integration-tests-config.json``), so runs on the same machine do not meet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.compat.compare import Outcomes, node_id, outcomes

#: The shared Redis: databases 12 (broker) and 13 (results) unless IDEM_BROKER and
#: IDEM_RESULTS (the tier's environment, tests/run.py) say otherwise.
REDIS = "redis://127.0.0.1:6379"
ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
#: The modules of Celery's suite that run, and what they import from ``t``.
MODULES = ("t/integration/test_tasks.py", "t/integration/test_canvas.py")
NEEDED = ("t/__init__.py", "t/canvas_helpers.py", "t/integration/", "pyproject.toml")
#: Runs: name -> the key kind for tests/compat/plugin.py (None: plain Celery).
RUNS: dict[str, str | None] = {
    "plain": None, "per_call": "per_call", "template": "template",
    "all_arguments": "all_arguments"}


@dataclass(frozen=True)
class Selection:
    """Which of Celery's tests run: every test of ``MODULES`` with ``full``, else the quick
    ones tests/compat/selection.toml lists (most of Celery's tests wait on the worker for
    seconds; a run of all of them takes over ten minutes here)."""

    tests: tuple[str, ...] | None
    #: Seconds a test may take (tests/compat/plugin.py): past it, it fails. The quick ones
    #: take under 5 s plain; some of the others wait on countdowns for over 30 s.
    timeout: int

    @classmethod
    def load(cls, full: bool, path: Path = HERE / "selection.toml") -> Selection:
        if full:
            return cls(None, 120)
        return cls(tuple(tomllib.loads(path.read_text())["quick"]), 15)

    def arguments(self) -> list[str]:
        return list(MODULES) if self.tests is None else [node_id(t) for t in self.tests]


def sdist(version: str, cache: Path) -> Path:
    """The sdist of Celery ``version``, downloaded into ``cache`` once."""
    tarball = cache / f"celery-{version}.tar.gz"
    if not tarball.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.check_call([
            sys.executable, "-m", "pip", "download", f"celery=={version}", "--no-deps",
            "--no-binary", ":all:", "--disable-pip-version-check", "-q", "-d", str(cache)])
    return tarball


def extract(tarball: Path, into: Path) -> Path:
    """Celery's integration suite (and what it imports) from ``tarball``; its folder."""
    with tarfile.open(tarball) as archive:
        top = archive.getnames()[0].split("/")[0]
        members = [m for m in archive.getmembers()
                   if m.name.removeprefix(f"{top}/").startswith(NEEDED)]
        archive.extractall(into, members=members, filter="data")
    return into / top


def configure(suite: Path, prefix: str) -> None:
    """Celery's own override file: every Redis key of the run under ``prefix``."""
    options = {"global_keyprefix": prefix}
    (suite / "integration-tests-config.json").write_text(json.dumps({
        "broker_transport_options": options, "result_backend_transport_options": options}))


def run_all(tarball: Path, workdir: Path, selection: Selection) -> dict[str, Outcomes]:
    """Every run of ``RUNS``, one after the other, each on a copy of the suite of its own;
    their outcomes per test. Not at once: Celery's tasks write Redis keys of fixed names
    (``redis-echo``, ``redis-count``) on database 0 (``t/integration/tasks.py``,
    ``get_redis_connection``), which two runs at once would share."""
    run_id = uuid.uuid4().hex[:8]
    found = {}
    for name in RUNS:
        code = _start(name, extract(tarball, workdir / name), workdir, run_id, selection).wait()
        found[name] = outcomes(workdir / f"{name}.xml")
        print(f"{name}: pytest exit status {code}, {len(found[name])} tests", flush=True)
    return found


def _start(name: str, suite: Path, workdir: Path, run_id: str,
           selection: Selection) -> subprocess.Popen[bytes]:
    kind = RUNS[name]
    env = {
        **os.environ, "PYTHONPATH": os.pathsep.join([str(suite), str(ROOT)]),
        "TEST_BROKER": os.environ.get("IDEM_BROKER", f"{REDIS}/12"),
        "TEST_BACKEND": os.environ.get("IDEM_RESULTS", f"{REDIS}/13"),
        "IDEM_COMPAT_TIMEOUT": os.environ.get("IDEM_COMPAT_TIMEOUT", str(selection.timeout)),
        "IDEM_COMPAT_KEYS": kind or "", "IDEM_PG_NAME": f"idem_compat_{run_id}_{name}",
        "IDEM_VAR_DIR": str(workdir / name / "var")}
    if not kind:
        # Plain Celery: no Django. With this set (pytest-django sets it in the tier's own
        # process), Celery's Django fixup would set up the test project on the worker.
        env.pop("DJANGO_SETTINGS_MODULE", None)
    configure(suite, f"idem-compat-{run_id}-{name}:")
    log = (workdir / f"{name}.log").open("wb")
    # Celery's fixtures (celery_parameters among them) are a plugin its conftest does not
    # load; tests/compat/plugin.py, after it, overrides celery_parameters.
    return subprocess.Popen([
        sys.executable, "-m", "pytest", *selection.arguments(), "-p", "celery.contrib.pytest",
        "-p", "tests.compat.plugin", "-p", "no:django", "-p", "no:cacheprovider",
        f"--junitxml={workdir / f'{name}.xml'}", "-q", "-o", "junit_family=xunit1"],
        cwd=suite, env=env, stdout=log, stderr=subprocess.STDOUT)
