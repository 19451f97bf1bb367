"""The benchmark suites ``python -m bench run SUITE`` runs, one question each.

A suite is a module with:

- ``main(argv)``: its measurement, with its own arguments (``python -m bench run SUITE --
  --help`` lists them); it writes one results file (``--out``);
- ``QUESTION``: what it answers, one line (``python -m bench list``);
- ``STACKS``: the stacks it runs on (``--stack``);
- ``arguments(options)``: the runner's options (``Options``) as its own arguments.

This module maps each suite's name to its module; nothing is imported before it is run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType

#: Suite name -> module (bench/suites/<module>.py).
SUITES = {
    "end-to-end": "end_to_end",
    "publishing": "publishing",
    "statements": "statements",
    "cpu": "cpu",
    "wal": "wal",
    "scaling": "scaling",
    "scale": "scale",
    "memory": "memory",
    "broker-loss": "broker_loss",
    "counts": "counts",
}
ALL_STACKS = ("postgres", "pgbouncer", "mysql", "sqlite")


@dataclass
class Options:
    """The runner's options, common to every suite (None: the suite's default)."""

    stack: str = "postgres"
    broker: str | None = None
    variants: str | None = None
    n: int | None = None
    rounds: int | None = None
    quick: bool = False
    extra: list[str] = field(default_factory=list)

    def pick(self, value: int | None, quick: int, flag: str) -> list[str]:
        """``[flag, value]``: the option given, else ``quick`` under ``--quick``, else
        nothing (the suite's full-run default)."""
        if value is None and self.quick:
            value = quick
        return [] if value is None else [flag, str(value)]


def load(name: str) -> ModuleType:
    if name not in SUITES:
        raise SystemExit(f"unknown suite {name!r}; choose from {', '.join(SUITES)}")
    return importlib.import_module(f"bench.suites.{SUITES[name]}")


def arguments(name: str, options: Options) -> list[str]:
    """The suite's own arguments for ``options``, refusing what it cannot run."""
    suite = load(name)
    if options.stack not in suite.STACKS:
        raise SystemExit(f"suite {name!r} runs on {', '.join(suite.STACKS)}, "
                         f"not --stack {options.stack}")
    return [*suite.arguments(options), *options.extra]


def refuse(name: str, option: str, value: object) -> None:
    """A runner option this suite has no use for: said, not silently ignored."""
    if value is not None:
        raise SystemExit(f"suite {name!r} takes no {option}")
