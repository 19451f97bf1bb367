"""The benchmark runner.

    python -m bench list
    python -m bench run SUITE [--stack postgres|pgbouncer|mysql] [--broker redis|rabbitmq]
                              [--variants A,B] [--n N] [--rounds R] [--quick] [--out FILE]
                              [-- SUITE'S OWN ARGUMENTS]
    python -m bench report [FILE ...] [--markdown] [--write PAGE]
    python -m bench plot [FILE ...] [--out PNG]

``run`` writes one results file (bench/lib/results.py); ``report`` and ``plot`` without
files read the committed baselines (bench/baselines/<stack>.json).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from bench import suites


def _list(args: argparse.Namespace) -> int:
    for name in suites.SUITES:
        suite = suites.load(name)
        print(f"{name:12} {suite.QUESTION}\n{'':12} stacks: {', '.join(suite.STACKS)}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from bench.lib import results

    options = suites.Options(stack=args.stack, broker=args.broker, variants=args.variants,
                             n=args.n, rounds=args.rounds, quick=args.quick,
                             extra=args.extra)
    argv = suites.arguments(args.suite, options)
    out = Path(args.out) if args.out else results.default_out(args.suite, args.stack)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "-m", "bench", *sys.argv[1:]])
    sys.argv[0] = f"python -m bench run {args.suite} --"  # what the suite's --help shows
    status = suites.load(args.suite).main([*argv, "--out", str(out)])
    if status or not out.exists():
        return status or 1
    results.stamp(out, args.suite, args.stack, command)
    print(out)
    return 0


def _report(args: argparse.Namespace) -> int:
    from bench.lib import report, results

    if args.files:
        print(report.files_report(args.files))
        return 0
    table = report.baseline_table(results.load_baselines())
    if args.write:
        report.write_between_markers(Path(args.write), table)
        print(args.write)
        return 0
    print(table if args.markdown else table.replace("`", ""))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from bench.lib import plot, results

    if args.files:
        print(plot.plot_stacks(args.files, Path(args.out or "bench/results/stacks.png"),
                               args.broker, targets=tuple(args.targets)))
    else:
        print(plot.plot_baselines(results.load_baselines(),
                                  Path(args.out or "bench/results/baselines.png")))
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the suites and the question each answers")
    run = sub.add_parser("run", help="run one suite, write its results file")
    run.add_argument("suite", choices=list(suites.SUITES))
    run.add_argument("--stack", choices=suites.ALL_STACKS, default="postgres")
    run.add_argument("--broker", choices=("redis", "rabbitmq", "memory"), default=None,
                     help="default: the suite's (Redis, or an in-memory one for cpu)")
    run.add_argument("--variants", default=None, help="comma-separated, the suite's names")
    run.add_argument("--n", type=int, default=None, help="tasks (or keys, rows) per run")
    run.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    run.add_argument("--quick", action="store_true",
                     help="a small run to see it work (a few hundred tasks, one round)")
    run.add_argument("--out", default=None, help="results file (default bench/results/)")
    report = sub.add_parser("report", help="the baselines' table, or a results file's")
    report.add_argument("files", nargs="*", help="end-to-end results files (default: the "
                        "baselines)")
    report.add_argument("--markdown", action="store_true")
    report.add_argument("--write", default=None, metavar="PAGE",
                        help="regenerate the table between the page's markers")
    plot = sub.add_parser("plot", help="figures of the baselines or of results files")
    plot.add_argument("files", nargs="*", help="end-to-end results files, one per stack")
    plot.add_argument("--broker", default=None)
    plot.add_argument("--targets", type=float, nargs="*", default=[])
    plot.add_argument("--out", default=None)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # the suite's own arguments
    args = parser().parse_args(argv[:len(argv) - len(extra) - (1 if extra else 0)])
    args.extra = extra
    return {"list": _list, "run": _run, "report": _report, "plot": _plot}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
