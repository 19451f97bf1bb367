"""Virtualenvs for the oldest and newest supported stacks: ``.venv-<name>`` in the checkout.

``tests/run.py``'s tiers ``oldest`` and ``newest`` run their tests in these; the whole
matrix is tox's (tox.ini). Each venv is made from a pyenv interpreter of the combination's
Python and has the project (editable) with its test extras installed, Django and Celery
pinned to the combination's ranges. A stamp file named after a digest of pyproject.toml,
the pins and the interpreter says it is up to date, as django_app/bootstrap.py does for
``.venv``; a changed pyproject or pin reinstalls into the same venv.

Standard library only: tests/run.py loads it before anything else is installed.
``python3 tests/venvs.py oldest`` makes (or refreshes) one and prints its Python.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Stack:
    """A Python minor version and the Django and Celery ranges tested on it."""

    name: str
    python: str
    requirements: tuple[str, ...]
    extras: str = "test"

    @property
    def venv(self) -> Path:
        return ROOT / f".venv-{self.name}"


#: The supported corners (README, Compatibility): the oldest Python with the oldest
#: Django and Celery, and the newest of each; and Django 6.0, the first with Django's
#: Tasks framework (the django60 tier). tox.ini covers everything in between.
STACKS = {
    "oldest": Stack("oldest", "3.11", ("django>=5.2,<5.3", "celery>=5.5,<5.6")),
    "newest": Stack("newest", "3.13", ("django>=6.1,<6.2", "celery>=5.7,<5.8")),
    "django60": Stack("django60", "3.12", ("django>=6.0,<6.1", "celery>=5.6,<5.7")),
}


def pyenv_python(minor: str) -> Path:
    """The newest pyenv-installed CPython ``minor`` (e.g. "3.11"), or a clear error."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    pattern = re.compile(rf"^{re.escape(minor)}\.(\d+)$")
    found = sorted(
        (int(m.group(1)), path)
        for path in (root.iterdir() if root.is_dir() else [])
        if (m := pattern.match(path.name)) and (path / "bin" / "python").exists()
    )
    if not found:
        raise SystemExit(f"Python {minor} is not installed in pyenv ({root}): "
                         f"`pyenv install {minor}` first")
    return found[-1][1] / "bin" / "python"


def _stamp(stack: Stack, interpreter: Path) -> str:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    digest.update("\n".join([str(interpreter), stack.extras, *stack.requirements]).encode())
    return f".installed-{digest.hexdigest()[:12]}"


def ensure(name: str) -> Path:
    """Make or refresh ``.venv-<name>``; its Python."""
    stack = STACKS[name]
    interpreter = pyenv_python(stack.python)
    python = stack.venv / "bin" / "python"
    stamp = stack.venv / _stamp(stack, interpreter)
    if stamp.exists():
        return python
    if not python.exists():
        print(f"creating {stack.venv} from {interpreter} ...", flush=True)
        subprocess.check_call([str(interpreter), "-m", "venv", str(stack.venv)])
    print(f"installing {ROOT}[{stack.extras}] {' '.join(stack.requirements)} "
          f"into {stack.venv} ...", flush=True)
    subprocess.check_call([
        str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
        "-e", f"{ROOT}[{stack.extras}]", *stack.requirements,
    ])
    for old in stack.venv.glob(".installed-*"):
        old.unlink()
    stamp.touch()
    return python


if __name__ == "__main__":
    for arg in sys.argv[1:] or list(STACKS):
        print(ensure(arg))
