"""The release proof's table on the reliability page, generated from the committed
reports of the release-size runs (``tests/chaos/results/release-<stack>.json``, written
by ``run.py --release --out``), one column per stack:

    python -m tests.chaos.summary            # print it
    python -m tests.chaos.summary --write    # into docs/explanation/reliability.md

tests/unit/test_docs.py keeps the page in step with the reports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tests" / "chaos" / "results"
PAGE = ROOT / "docs" / "explanation" / "reliability.md"
START, END = "<!-- release:start -->", "<!-- release:end -->"
#: The stacks of the release proof, in the page's order: the report's name, the column.
STACKS = {"postgres": "PostgreSQL", "pgbouncer": "PgBouncer", "mariadb": "MariaDB"}
#: Faults of the job database or its pooler, summed into one row.
SERVER_FAULTS = ("pg_restart", "mariadb_restart", "pgbouncer_restart", "pgbouncer_kill")


def reports(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """The release reports committed, by stack (a stack without one is left out)."""
    return {stack: json.loads(path.read_text()) for stack in STACKS
            if (path := folder / f"release-{stack}.json").exists()}


def _rows(report: dict[str, Any]) -> dict[str, str]:
    faults = report["faults"]
    checks = {c["name"]: c for c in report["checks"]}
    rows = {
        "result": "every check passed" if report["ok"] else "**FAILED**",
        "jobs": f"{report['figures']['jobs']:,}",
        "messages published": f"{int(report['run']['messages published'].split(' ')[0]):,}",
        "SIGKILLs (children + whole workers)":
            f"{faults.get('kill_child', 0)} + {faults.get('kill_worker', 0)}",
        "zombies frozen past their lease": str(faults.get("zombie", 0)),
        "broker (Redis) restarts": str(faults.get("redis_restart", 0)),
        "database and pooler restarts, `KILL`s":
            str(sum(faults.get(kind, 0) for kind in SERVER_FAULTS)),
    }
    for name, check in checks.items():
        if check["expected"] == "reported":
            rows[name] = str(check["value"])
        else:
            rows[name] = str(check["value"]) + ("" if check["ok"] else " **(failed)**")
    rows["elapsed"] = report["run"]["elapsed"].split(" ")[0]
    rows["load average at the end (1, 5, 15 min)"] = report["versions"]["load average at the end"]
    return rows


def table(found: dict[str, dict[str, Any]]) -> str:
    """The Markdown between the page's markers: the table and where each report is."""
    if not found:
        return "No release-size run has been committed yet."
    columns = {stack: _rows(report) for stack, report in found.items()}
    names = list(next(iter(columns.values())))
    lines = ["| | " + " | ".join(STACKS[s] for s in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    lines += [f"| {name} | " + " | ".join(rows.get(name, "") for rows in columns.values())
              + " |" for name in names]
    first = next(iter(found.values()))
    packages = ", ".join(f"{k} {v}" for k, v in first["versions"]["Python packages"].items())
    lines += ["", f"Seed {first['run']['seed']}; {first['versions']['machine']}; Python "
              f"{first['versions']['python']}, {packages}. Each run's whole report (the fault "
              "log, examples for every check, the servers' versions): " + ", ".join(
                  f"[{STACKS[s]}](https://github.com/celery-idem/celery-idem/blob/main/tests/"
                  f"chaos/results/release-{s}.md)" for s in found) + "."]
    return "\n".join(lines)


def render(page: str, found: dict[str, dict[str, Any]]) -> str:
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table(found)}\n{END}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write it into {PAGE}")
    args = parser.parse_args()
    if args.write:
        PAGE.write_text(render(PAGE.read_text(), reports()))
    else:
        print(table(reports()))


if __name__ == "__main__":
    main()
