"""The chaos run's report as files (``run.py --out PREFIX``): ``PREFIX.json`` with every
figure, check and fault, and ``PREFIX.md`` with the tables the reliability docs quote;
and the machine and versions they ran on."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

from tests.services.mariadb import MARIADBD, MariaDB
from tests.services.pgbouncer import PgBouncer

from .checks import Check, markdown
from .faults import Injector
from .servers import PG_BIN, Postgres, Redis

PACKAGES = ("celery", "kombu", "django", "psycopg", "mysqlclient", "redis")


def _first_line(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except OSError as exc:
        return f"unknown ({exc})"
    return (done.stdout or done.stderr).strip().splitlines()[0]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine(database: Postgres | MariaDB, pooler: PgBouncer | None,
            redis: Redis | None) -> dict[str, Any]:
    """Where the run ran: the machine, its load, the Python packages and the servers."""
    servers = {"database": _first_line(
        [MARIADBD, "--version"] if isinstance(database, MariaDB)
        else [str(PG_BIN / "postgres"), "--version"])}
    if pooler is not None:
        servers["pooler"] = _first_line([pooler.args[0], "--version"])
    if redis is not None:
        servers["broker"] = _first_line(["redis-server", "--version"])
    packages = {name: _version(name) for name in PACKAGES}
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} "
                       f"{platform.release()}",
            "load average at the end": " ".join(f"{n:.1f}" for n in os.getloadavg()),
            "python": platform.python_version(),
            "Python packages": {name: v for name, v in packages.items() if v},
            "servers": servers}


def write(out: Path, ok: bool, title: dict[str, Any], checks: list[Check],
          injector: Injector, wall_start: float, figures: dict[str, Any],
          versions: dict[str, Any]) -> None:
    """``out``.json and ``out``.md (folders made as needed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    faults = Counter(f.kind for f in injector.faults)
    data = {
        "ok": ok, "run": title, "versions": versions,
        "checks": [{"name": c.name, "value": c.value, "expected": c.expected, "ok": c.ok,
                    "examples": c.examples[:20]} for c in checks],
        "faults": dict(sorted(faults.items())), "faults required": injector.required,
        "faults short of the requirement": injector.shortfalls(),
        "fault injection errors": injector.errors,
        "fault log": [{"kind": f.kind, "at": round(f.at - wall_start, 1), "pids": f.pids,
                       "detail": f.detail} for f in injector.faults],
        "figures": figures,
    }
    Path(f"{out}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    machine_rows = {"machine": versions["machine"],
                    "load average at the end": versions["load average at the end"],
                    "python": versions["python"],
                    "Python packages": ", ".join(f"{k} {v}" for k, v in
                                                 versions["Python packages"].items()),
                    **versions["servers"]}
    text = [f"# Chaos run: {'every check passed' if ok else 'FAILED'}", "",
            markdown(title, checks, faults), "", "| machine | |", "| --- | --- |",
            *(f"| {name} | {value} |" for name, value in machine_rows.items())]
    if injector.errors or injector.shortfalls():
        text += ["", f"Faults that could not be injected: {injector.errors}; "
                     f"kinds short of the requirement (struck, required): "
                     f"{injector.shortfalls()}"]
    Path(f"{out}.md").write_text("\n".join(text) + "\n")
