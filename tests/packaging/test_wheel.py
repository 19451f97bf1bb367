"""The package as a user gets it: the sdist and wheel built with ``build``, checked with
``twine``, the wheel installed with its extras into a fresh virtualenv, and a minimal
project outside the checkout, set up as the README says, running tasks through real
``celery worker`` processes on PostgreSQL, behind PgBouncer and on MariaDB.

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
import tarfile
import time
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import IN_CI, require_service
from tests.services import pgbouncer

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


def test_the_license_is_in_the_wheel_and_the_sdist(dist: Path, wheel: Path) -> None:
    """The MIT license text pyproject declares travels with both archives: the wheel's
    dist-info holds LICENSE, and so does the sdist's root."""
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License")
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(f"{dist_info}/licenses/LICENSE").decode() == license_text
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        assert "License-File: LICENSE" in archive.read(metadata).decode()
    (sdist,) = dist.glob("celery_idem-*.tar.gz")
    with tarfile.open(sdist) as archive:
        root = archive.getnames()[0].split("/", 1)[0]
        member = archive.extractfile(f"{root}/LICENSE")
        assert member is not None and member.read().decode() == license_text


def test_the_extras_name_what_their_transport_needs(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [line.split(":", 1)[1].strip()
                    for line in archive.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    assert any(r.startswith("celery[redis]") and 'extra == "redis"' in r for r in requires)
    assert any(r.startswith("psycopg[binary]") and 'extra == "postgres"' in r
               for r in requires)
    assert any(r.startswith("mysqlclient") and 'extra == "mysql"' in r for r in requires)
    assert any(r.startswith("prometheus_client") and 'extra == "metrics"' in r
               for r in requires)


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel and the extras of every stack the project below
    runs on (postgres, mysql, redis); its bin/."""
    venv = tmp_path_factory.mktemp("user-venv")
    run([sys.executable, "-m", "venv", str(venv)], cwd=venv)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
         "--disable-pip-version-check", f"{wheel}[postgres,mysql,redis]"], cwd=venv)
    return venv / "bin"


@contextmanager
def fresh_database(kind: str) -> Iterator[dict[str, str]]:
    """An empty database for the project on ``kind`` (behind a PgBouncer of its own for
    "pgbouncer"); the SMOKE_* variables that point the project at it."""
    name = f"idem_wheel_{uuid.uuid4().hex[:8]}"
    if kind == "mariadb":
        require_service("mariadb")
        import MySQLdb

        admin = MySQLdb.connect(host="127.0.0.1", port=3306, user="root")
        admin.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        try:
            yield {"SMOKE_DB": name}
        finally:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
            admin.close()
        return
    require_service("postgres")
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        if kind == "pgbouncer":
            if pgbouncer.binary() is None:
                missing = "pgbouncer is not installed (apt-get install pgbouncer)"
                pytest.fail(missing) if IN_CI else pytest.skip(missing)
            with pgbouncer.running() as bouncer:
                yield {"SMOKE_DB": name, "SMOKE_PORT": str(bouncer.port)}
        else:
            yield {"SMOKE_DB": name, "SMOKE_PORT": "5432"}
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def user_env(project: Path, kind: str, database: dict[str, str]) -> dict[str, str]:
    """The environment of a user's shell: nothing pointing into the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV")
           and not k.startswith("IDEM_")}
    return {**env, **database, "SMOKE_DATABASE": kind, "SMOKE_BROKER": f"{REDIS}/0",
            "SMOKE_RESULTS": f"{REDIS}/1", "SMOKE_QUEUE": f"idem-wheel-{database['SMOKE_DB']}",
            "SMOKE_EFFECTS": str(project / "effects.txt")}


class Worker:
    """``celery -A smokeproj worker`` of the installed package, as a user starts it."""

    def __init__(self, installed: Path, project: Path, env: dict[str, str], name: str):
        self.log_path = project.parent / f"{name}.log"
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [str(installed / "celery"), "-A", "smokeproj", "worker", "-P", "prefork",
                 "-c", "2", "-Q", env["SMOKE_QUEUE"], "-n", f"{name}@%h",
                 "--without-gossip", "--without-mingle", "-l", "INFO"],
                cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        """Warm shutdown (a SIGKILL if it does not end); the exit code."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def wait_for(path: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.05)


@pytest.mark.parametrize("kind", ["postgres", "pgbouncer", "mariadb"])
def test_a_project_following_the_readme_runs_each_key_once_and_survives_a_killed_worker(
        installed: Path, kind: str, tmp_path: Path) -> None:
    """Outside the checkout, on the wheel, with the README's settings for the database:
    ``check`` clean, ``migrate``, a task published twice runs once and a third publish
    replays it, and a job whose whole worker was SIGKILLed mid-body runs again after
    the recovery pass, its effect made once."""
    require_service("redis")
    project = tmp_path / "project"
    smoke_project.write(project)
    python = str(installed / "python")
    with fresh_database(kind) as database:
        env = user_env(project, kind, database)
        checked = run([python, "manage.py", "check", "--fail-level", "WARNING"], project, env)
        assert "no issues" in checked
        run([python, "manage.py", "migrate", "--no-input"], project, env)

        worker = Worker(installed, project, env, "first")
        try:
            done = subprocess.run([python, "smoke_check.py"], cwd=project, env=env,
                                  capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{worker.log()}"
            run([python, "manage.py", "shell", "-c",
                 "from smokeapp.tasks import pack; pack.delay(9)"], project, env)
            wait_for(project / "effects.txt.started")
        finally:
            worker.process.kill()  # the whole worker: its pool children die with it
            worker.process.wait()
        seen = json.loads(done.stdout.strip().splitlines()[-1])

        second = Worker(installed, project, env, "second")
        try:
            (project / "effects.txt.release").touch()
            recovered = json.loads(run([python, "smoke_recover.py", "pack/9"], project,
                                       env).strip().splitlines()[-1])
        finally:
            exit_code = second.stop()

    assert Path(seen["package"]).is_relative_to(installed.parent), seen["package"]
    assert seen["results"] == [{"order": 7}] * 3
    assert seen["jobs"] == [["ship/7", "SUCCEEDED"]]
    assert seen["admin_status"] == 200
    assert seen["admin_lists_the_key"]
    assert seen["stylesheet"]
    assert recovered == {"state": "SUCCEEDED", "attempt": 2, "result": {"packed": 9}}, \
        second.log()
    assert (project / "effects.txt").read_text() == "shipped 7\npacked 9\n"
    assert (project / "effects.txt.started").read_text() == "attempt 1\nattempt 2\n"
    assert exit_code == 0, second.log()
