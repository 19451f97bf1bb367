"""What a results file records of the run besides its numbers: package and server
versions, the machine, the git commit and the load average. Apart from
bench/lib/common.py's helpers that set the run up, since it only reads what is there.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.lib.common import BROKERS, REDIS_HOST, REDIS_PORT, ROOT, loadavg


def environment() -> dict[str, Any]:
    """Versions and machine, for the results file."""
    from importlib.metadata import PackageNotFoundError, version

    pkgs = {}
    for name in ("celery", "kombu", "billiard", "amqp", "redis", "django", "psycopg",
                 "celery-once", "celery-idem"):
        try:
            pkgs[name] = version(name)
        except PackageNotFoundError:
            pkgs[name] = None
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    try:
        mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    server = {}
    try:
        from django.db import connection

        with connection.cursor() as cursor:
            if connection.vendor == "mysql":
                cursor.execute("SELECT VERSION()")
                server["mariadb"] = cursor.fetchone()[0]
            else:
                cursor.execute("SHOW server_version")
                server["postgresql"] = cursor.fetchone()[0]
                for name in ("fsync", "synchronous_commit", "shared_buffers"):
                    cursor.execute(f"SHOW {name}")
                    server[f"postgresql.{name}"] = cursor.fetchone()[0]
    except Exception:  # noqa: BLE001 - Django not set up: leave it out
        pass
    try:
        import redis

        server["redis"] = redis.Redis(host=REDIS_HOST, port=REDIS_PORT).info()["redis_version"]
    except Exception:  # noqa: BLE001
        server["redis"] = None
    server["rabbitmq"] = _rabbitmq_version()
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "celery_idem"], cwd=ROOT,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except OSError:
        git, dirty = "", False
    return {
        "python": platform.python_version(), "packages": pkgs, "servers": server,
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": round(mem_kib / 2**20, 1),
                    "kernel": platform.release()},
        "git": git + ("+dirty(celery_idem)" if dirty else ""),
        "loadavg": loadavg(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _rabbitmq_version() -> str | None:
    try:
        from kombu import Connection

        with Connection(BROKERS["rabbitmq"], connect_timeout=3) as conn:
            conn.connect()
            props = conn.connection.server_properties
            v = props.get("version")
            return v.decode() if isinstance(v, bytes) else v
    except Exception:  # noqa: BLE001
        return None
