"""Make ``.venv`` with the project installed, then re-run the calling script inside it.

Loaded by path (not as ``django_app.bootstrap``) by the quickstart scripts, because the
package imports Celery, which a fresh machine does not have yet. Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"


def ensure_venv(extras: str = "") -> None:
    """Re-run the current script with .venv's Python, making .venv first if needed."""
    if sys.version_info < (3, 11):  # noqa: UP036 - runs under any system python3
        sys.exit(f"celery-idem needs Python 3.11 or newer, not {sys.version.split()[0]}")
    python = VENV / "bin" / "python"
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:12]
    stamp = VENV / f".installed-{extras}-{digest}"
    if not python.exists():
        print(f"creating {VENV} ...", flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    if not stamp.exists():
        target = f"{ROOT}[{extras}]" if extras else str(ROOT)
        print(f"installing {target} into {VENV} ...", flush=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.check_call([*pip, "--upgrade", "pip"])
        subprocess.check_call([*pip, "-e", target])
        stamp.touch()
    os.execv(str(python), [str(python), *sys.argv])
