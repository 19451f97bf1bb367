"""The package as a user gets it: the sdist and wheel built with ``build``, checked with
``twine``, the wheel installed with its ``[postgres,redis]`` extras into a fresh
virtualenv, and a minimal project outside the checkout running a task through a real
``celery worker``.

PostgreSQL and Redis, not SQLite and the filesystem transport: the extras are what a
user's install needs for a production stack, and only a real driver and transport show
that they bring everything (the reported ``ModuleNotFoundError`` came from a transport).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_service

from . import smoke_project

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_idem"
REDIS = "redis://127.0.0.1:6379"
PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 300) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel, built as a release would be: the wheel from the sdist,
    so a file the sdist leaves out is missing from the wheel too."""
    # From a copy of the files git would commit: a build in the checkout reads the
    # file list an earlier build left in celery_idem.egg-info, which hides a file the
    # configuration no longer includes.
    source = tmp_path_factory.mktemp("source")
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                 cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], cwd=source)
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (found,) = dist.glob("celery_idem-*.whl")
    return found


def test_twine_accepts_the_sdist_and_the_wheel(dist: Path) -> None:
    files = sorted(str(p) for p in dist.iterdir())
    assert len(files) == 2, files
    output = run([sys.executable, "-m", "twine", "check", "--strict", *files], cwd=dist)
    assert output.count("PASSED") == 2, output


def test_the_wheel_holds_the_whole_package_and_nothing_else(wheel: Path) -> None:
    """Every file of celery_idem/ in the checkout (migrations, templates, static files,
    SQL, py.typed, locale when there is one), and no project, test or benchmark file."""
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert expected - names == set()
    for needed in ("celery_idem/py.typed", "celery_idem/migrations/0001_initial.py",
                   "celery_idem/templates/admin/celery_idem/job/change_list.html",
                   "celery_idem/static/celery_idem/admin.css",
                   "celery_idem/backends/postgresql.sql"):
        assert needed in names
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    assert {name.split("/", 1)[0] for name in names} == {"celery_idem", dist_info}


def test_the_extras_name_what_their_transport_needs(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [line.split(":", 1)[1].strip()
                    for line in archive.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    assert any(r.startswith("celery[redis]") and 'extra == "redis"' in r for r in requires)
    assert any(r.startswith("psycopg[binary]") and 'extra == "postgres"' in r
               for r in requires)


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel and its postgres and redis extras; its bin/."""
    venv = tmp_path_factory.mktemp("user-venv")
    run([sys.executable, "-m", "venv", str(venv)], cwd=venv)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
         "--disable-pip-version-check", f"{wheel}[postgres,redis]"], cwd=venv)
    return venv / "bin"


@pytest.fixture
def database() -> Iterator[str]:
    require_service("postgres")
    require_service("redis")
    import psycopg

    name = f"idem_wheel_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def user_env(project: Path, database: str) -> dict[str, str]:
    """The environment of a user's shell: nothing pointing into the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV")
           and not k.startswith("IDEM_")}
    return {**env, "SMOKE_DB": database, "SMOKE_BROKER": f"{REDIS}/0",
            "SMOKE_RESULTS": f"{REDIS}/1", "SMOKE_QUEUE": f"idem-wheel-{database}",
            "SMOKE_EFFECTS": str(project / "effects.txt")}


def test_a_project_outside_the_checkout_runs_a_duplicated_task_once(
        installed: Path, database: str, tmp_path: Path) -> None:
    project = tmp_path / "project"
    smoke_project.write(project)
    env = user_env(project, database)
    python = str(installed / "python")

    checked = run([python, "manage.py", "check", "--fail-level", "WARNING"], project, env)
    assert "no issues" in checked
    run([python, "manage.py", "migrate", "--no-input"], project, env)

    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [str(installed / "celery"), "-A", "smokeproj", "worker", "-P", "prefork", "-c", "2",
         "-Q", env["SMOKE_QUEUE"], "-n", f"{database}@%h", "--without-gossip",
         "--without-mingle", "-l", "INFO"],
        cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # Both results come back only once the worker has handled both messages.
        done = subprocess.run([python, "smoke_check.py"], cwd=project, env=env,
                              capture_output=True, text=True, timeout=180)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()
    worker_log = (tmp_path / "worker.log").read_text()
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\nworker:\n{worker_log}"
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    assert Path(seen["package"]).is_relative_to(installed.parent), seen["package"]
    assert seen["results"] == [{"order": 7}, {"order": 7}]
    assert (project / "effects.txt").read_text() == "shipped 7\n", worker_log
    assert seen["jobs"] == [["ship/7", "SUCCEEDED"]]
    assert seen["admin_status"] == 200
    assert seen["admin_lists_the_key"]
    assert seen["stylesheet"]
    assert worker.returncode == 0, worker_log
