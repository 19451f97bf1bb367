"""Run a bench/ script as a user would, and read the results file it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(env: dict[str, str], tmp_path: Path, script: str, *args: str,
        timeout: float = 120) -> dict:
    out = tmp_path / f"{Path(script).stem}.json"
    proc = subprocess.run([sys.executable, f"bench/{script}", *args, "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())
