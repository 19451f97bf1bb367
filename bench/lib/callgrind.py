"""Instructions per loop under callgrind: a count the machine's load does not change.

``run_under(argv, out_dir)`` re-runs the benchmark under ``valgrind --tool=callgrind``
with collection on from the start (so every loop is instrumented); inside it,
``Counter.count(name, fn)`` zeroes callgrind's counters, runs ``fn`` and has callgrind
dump them (a client request, through a tiny C shim compiled here with gcc), then reads
the dump's ``summary:`` line: the instructions this process executed in ``fn`` alone
(PostgreSQL's and the broker's are not in it, as with ``time.process_time``).
``PYTHONHASHSEED=0`` keeps set and dict orders, and so the count, the same run to run.
``run_under(..., instrument=False)`` starts the program uninstrumented (valgrind's core
alone, several times faster than callgrind: Django's setup and imports), and
``Counter.start()`` turns callgrind's instrumentation on before the first loop.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ENV = "BENCH_CALLGRIND_DIR"
SHIM = """#include <valgrind/callgrind.h>
void idem_zero(void) { CALLGRIND_ZERO_STATS; }
void idem_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
void idem_start(void) { CALLGRIND_START_INSTRUMENTATION; }
"""


def active() -> bool:
    """Whether this process is the one running under callgrind."""
    return bool(os.environ.get(ENV))


def run_under(argv: list[str], out_dir: Path, instrument: bool = True) -> int:
    """Run ``python argv`` under callgrind (this process waits); its exit status.
    ``instrument`` False: uninstrumented until ``Counter.start()``."""
    for tool in ("valgrind", "gcc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"--instructions needs {tool} (apt-get install valgrind gcc)")
    if not Path("/usr/include/valgrind/callgrind.h").exists():
        raise SystemExit("--instructions needs valgrind's headers (valgrind/callgrind.h)")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("cg.out*"):
        old.unlink()
    src, lib = out_dir / "shim.c", out_dir / "shim.so"
    src.write_text(SHIM)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    env = {**os.environ, ENV: str(out_dir), "PYTHONHASHSEED": "0"}
    cmd = ["valgrind", "--tool=callgrind", "--quiet",
           f"--callgrind-out-file={out_dir / 'cg.out'}",
           *([] if instrument else ["--instr-atstart=no"]), sys.executable, *argv]
    return subprocess.run(cmd, env=env, cwd=Path(__file__).resolve().parents[2]).returncode


class Counter:
    """Counts the instructions of one call at a time (inside ``run_under`` only)."""

    def __init__(self) -> None:
        self.dir = Path(os.environ[ENV])
        self.lib = ctypes.CDLL(str(self.dir / "shim.so"))
        self.dumps = 0

    def start(self) -> None:
        """Turn instrumentation on (a run started with ``instrument=False``)."""
        self.lib.idem_start()

    def count(self, name: str, fn: Callable[[], None]) -> int:
        self.lib.idem_zero()
        fn()
        self.lib.idem_dump(name.encode())
        self.dumps += 1
        dump = self.dir / f"cg.out.{self.dumps}"
        for line in dump.read_text().splitlines():
            if line.startswith("summary:"):
                dump.unlink()  # each is megabytes; the count is all that is kept
                return int(line.split()[1])
        raise RuntimeError(f"no summary in {dump}")
