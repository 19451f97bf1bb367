"""The demo from start to summary (``example_project/demo.py`` parses the flags)."""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent  # example_project/
ROOT = HERE.parent


def configure(args: Any) -> Path:
    """Environment for this process and the workers; a clean var/ and database."""
    var = Path(args.var or HERE / "var").resolve()
    shutil.rmtree(var, ignore_errors=True)  # a clean run every time
    (var / "events").mkdir(parents=True)
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "shop.settings", "SHOP_VAR": str(var),
        "SHOP_DATABASE": args.database, "SHOP_BROKER": args.broker, "SHOP_QUEUE": args.queue,
        "SHOP_DEMO_EVENTS": str(var / "events"),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    })
    if args.database != "sqlite":
        from .database import recreate_postgres

        recreate_postgres(args.database)
    sys.path[:0] = [str(HERE), str(ROOT)]
    return var


def prepare() -> str:
    """Migrate, stock the shelves, and make an admin user; returns its password."""
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from shop.models import Product

    from .workload import SKUS, STOCK

    call_command("migrate", verbosity=0)
    Product.objects.bulk_create([Product(sku=sku, quantity=STOCK) for sku in SKUS])
    password = secrets.token_urlsafe(12)
    User.objects.create_superuser("admin", "admin@shop.example", password)
    from shop.celery import app

    app.control.purge()  # a server broker may hold an earlier run's messages
    return password


def main(args: Any) -> int:
    from django_app.fakes.provider import serve

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    var = configure(args)
    with serve() as provider:
        os.environ["SHOP_PROVIDER_URL"] = provider.url
        password = prepare()
        return drive(args, var, provider, password)


def drive(args: Any, var: Path, provider: Any, password: str) -> int:
    from django.conf import settings
    from rich import box
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from celery_idem.models import Job

    from .checks import summarize
    from .processes import Fleet
    from .workload import Workload

    console = Console()
    fleet = Fleet(env=dict(os.environ), cwd=HERE, logs=var / "logs",
                  queues=f"{settings.CELERY_TASK_DEFAULT_QUEUE},{settings.CONTROL_QUEUE}")
    work = Workload(args.orders, args.kills, random.Random(args.seed))
    db = "SQLite (WAL)" if args.database == "sqlite" else "PostgreSQL"
    console.print(f"[bold]celery-idem demo[/]: {args.orders} orders on {db} + "
                  f"{args.broker.split('://')[0]}, {args.workers} workers (prefork -c 2) and "
                  f"beat, {args.kills} whole-worker kills. Logs: {os.path.relpath(var / 'logs')}")
    fleet.start_beat()
    for _ in range(args.workers):
        fleet.start_worker()
    with console.status("starting workers ..."):
        fleet.wait_ready()
    started = time.monotonic()
    done = 0
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("jobs"), TimeElapsedColumn(), TextColumn("{task.fields[status]}")]
    try:
        with Progress(*columns, console=console) as bar:
            task = bar.add_task("running", total=work.expected_jobs, status="")
            deadline = started + args.timeout
            while done < work.expected_jobs and time.monotonic() < deadline:
                work.place_some(done)
                killed = work.maybe_kill(fleet, done)
                if killed:
                    bar.console.print(f"  [red]SIGKILL[/] {killed} at {done} jobs done; "
                                      "replacement started")
                done = Job.objects.filter(task_name__startswith="shop.tasks.",
                                          state="SUCCEEDED").count()
                bar.update(task, completed=done, status=(
                    f"orders {len(work.committed)}  crashes {len(fleet.kills)}  "
                    f"workers {len(fleet.alive())}"))
                time.sleep(0.2)
        elapsed = time.monotonic() - started
    finally:
        with console.status("stopping workers and beat ...") as status:
            stopped = fleet.stop(lambda line: status.update(line))
    console.print(f"workers and beat stopped (warm shutdown) in {stopped:.1f} s")
    summary, details = summarize(work, fleet.kills, var / "events",
                                 provider.provider.charges, elapsed)
    table = Table(title="summary", show_header=False, box=box.SIMPLE)
    for _ in range(3):
        table.add_column(no_wrap=True)
    for line in summary.lines:
        mark = "" if line.ok is None else ("[green]ok[/]" if line.ok else "[red]FAILED[/]")
        table.add_row(line.name, line.value, mark)
    console.print(table)
    for detail in details:
        console.print(f"  [red]{detail}[/]")
    console.print("[bold green]every check passed[/]" if summary.passed
                  else "[bold red]SOME CHECKS FAILED[/]")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {line.name: {"value": line.value, "ok": line.ok} for line in summary.lines},
            indent=1))
    next_steps(console, args, password)
    return 0 if summary.passed else 1


def next_steps(console: Any, args: Any, password: str) -> None:
    env = "" if args.database == "sqlite" else f"SHOP_DATABASE={args.database} "
    env += "" if args.broker == "filesystem://" else f"SHOP_BROKER={args.broker} "
    env += "" if args.queue == "shop" else f"SHOP_QUEUE={args.queue} "
    env += "" if args.var is None else f"SHOP_VAR={args.var} "
    manage = f"{env}.venv/bin/python example_project/manage.py"
    console.print(f"""
What next, from the repository's root:
  jobs per task and state, and what needs attention:
    {manage} idem_status
  the admin on the demo's data (http://127.0.0.1:8000/admin/):
    {manage} runserver
    user [bold]admin[/], password [bold]{password}[/] (generated for this run, shown once)""")
