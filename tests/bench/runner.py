"""Run ``python -m bench`` as a user would, and read the results file a suite wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bench(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    """``python -m bench ARGS``: its output; a failure shows its last lines."""
    proc = subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, \
        f"bench {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


def run(env: dict[str, str], tmp_path: Path, suite: str, *args: str,
        timeout: float = 120) -> dict:
    """``python -m bench run SUITE ARGS``: the results file it wrote."""
    out = tmp_path / f"{suite}.json"
    ours = list(args[:args.index("--")] if "--" in args else args)
    bench(env, "run", suite, *ours, "--out", str(out), *args[len(ours):], timeout=timeout)
    data = json.loads(out.read_text())
    assert (data["format"], data["suite"]) == ("celery-idem-bench/1", suite)
    assert data["command"].startswith(f"python -m bench run {suite}")
    return data
