"""The committed migrations match the models under the Django this run has.

tests/run.py's static checks run this once in .venv; here it runs in every tier, so the
oldest and newest Django supported each check that a migration they would generate
does not differ from the committed ones (both the test project and the demo's shop).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("project", [
    ["--settings=django_app.settings"],
    ["--pythonpath=example_project", "--settings=shop.settings"],
], ids=["test-project", "shop"])
def test_makemigrations_finds_no_changes(project, tmp_path):
    env = {**os.environ, "IDEM_VAR_DIR": str(tmp_path / "var"),
           "SHOP_VAR": str(tmp_path / "shop"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "django", "makemigrations", "--check", "--dry-run", *project],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No changes detected" in done.stdout
