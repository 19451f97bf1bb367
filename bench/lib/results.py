"""Results files and baselines.

A run writes one results file: the suite's own measurements (its ``summary``, ``runs``
or ``results``, its ``settings``), the environment record (bench/lib/environment.py)
and, added by the runner, ``format``, ``suite``, ``stack`` and the ``command`` that ran
it. By default it goes to ``bench/results/<suite>-<stack>-<UTC time>.json`` (not
committed).

A baseline, ``bench/baselines/<stack>.json``, is the committed reference of one stack
for a release: ``{"format", "stack", "release", "note", "results": [results file, ...]}``,
each results file with its ``source`` (where it was first written). The performance page
is generated from the baselines (``python -m bench report``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bench.lib.common import RESULTS, ROOT

FORMAT = "celery-idem-bench/1"
BASELINES = ROOT / "bench" / "baselines"
STACK_ORDER = ("postgres", "pgbouncer", "mysql")


def default_out(suite: str, stack: str) -> Path:
    return RESULTS / f"{suite}-{stack}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"


def stamp(path: Path, suite: str, stack: str, command: str) -> dict[str, Any]:
    """Mark the results file a suite wrote as the runner's: its format, suite, stack and
    command first, the suite's own keys after."""
    data = json.loads(path.read_text())
    data.pop("command", None)
    data = {"format": FORMAT, "suite": suite, "stack": stack, "command": command, **data}
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return data


def load_baselines(folder: Path = BASELINES) -> list[dict[str, Any]]:
    """Every stack's baseline, in the order PostgreSQL, PgBouncer, MariaDB."""
    found = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    return [found[s] for s in (*STACK_ORDER, *sorted(set(found) - set(STACK_ORDER)))
            if s in found]
