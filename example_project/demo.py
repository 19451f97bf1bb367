"""The demo: ``python3 example_project/demo.py``.

A small shop (``shop/``) under fire. On the embedded default (SQLite in WAL mode and
celery-idem's filesystem transport, nothing to start) it migrates a fresh database,
starts worker processes and beat, places orders in transactions, publishes every task
more than once (some copies meet the first attempt while it runs), SIGKILLs whole
workers at random moments and starts replacements, and then checks every effect: one
charge at the payment provider, one stock deduction, one shipment, one of each step per
order, and every repeated e-mail matched to a crash. Exit status 1 if a check fails.

The same on PostgreSQL and Redis or RabbitMQ:
``python3 example_project/demo.py --database postgres://postgres@127.0.0.1:5432/shopdemo
--broker redis://127.0.0.1:6379/5`` (the database is dropped and created afresh).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "bootstrap", HERE.parent / "django_app" / "bootstrap.py")
assert _spec and _spec.loader
_bootstrap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bootstrap)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--orders", type=int, default=200, help="orders to place (200)")
    parser.add_argument("--kills", type=int, default=3,
                        help="whole workers SIGKILLed during the run (3)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes (3)")
    parser.add_argument("--database", default="sqlite",
                        help="sqlite (default) or postgres://user@host:port/name")
    parser.add_argument("--broker", default="filesystem://",
                        help="filesystem:// (default), redis://... or amqp://...")
    parser.add_argument("--queue", default="shop", help="the queue's name (shop)")
    parser.add_argument("--var", help="folder for SQLite, broker and logs "
                                      "(example_project/var)")
    parser.add_argument("--seed", type=int, help="random seed (orders, kill moments)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="give up after this many seconds (600)")
    parser.add_argument("--json", help="also write the summary to this file, as JSON")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse(sys.argv[1:])
    servers = arguments.database != "sqlite" or not arguments.broker.startswith("filesystem")
    _bootstrap.ensure_venv("demo,postgres,redis" if servers else "demo")
    sys.path.insert(0, str(HERE))
    sys.path.insert(1, str(HERE.parent))
    from shopdemo.run import main

    sys.exit(main(arguments))
