"""The test suite's tiers and static checks, as data: what each pytest run tests, on which
database and broker, and which tiers run in the second lane, beside the first
(tests/run.py runs them). Standard library only: tests/run.py reads it before anything
is installed."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REDIS = "redis://127.0.0.1:6379"
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"
SERVICES = {"postgres": 5432, "redis": 6379, "rabbitmq": 5672, "mariadb": 3306}
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Tier:
    """One pytest run: what it tests, on which database and broker."""

    name: str
    about: str
    paths: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    services: tuple[str, ...] = ()
    #: Only with ``--full`` (or named with ``--tier``): the whole matrix, too slow for CI.
    full_only: bool = False
    #: Run in ``.venv-<stack>`` (tests/venvs.py: another Python, Django and Celery)
    #: instead of ``.venv``.
    stack: str | None = None
    #: A pytest ``-m`` expression: the subset of ``paths`` this tier runs (all of them
    #: with ``--full``).
    markers: str | None = None
    #: More test paths that only ``--full`` runs.
    full_paths: tuple[str, ...] = ()
    #: A server the tier starts for itself in front of the shared ones ("pgbouncer").
    server: str | None = None
    #: The project's extras the tier needs besides ``test`` (tests/run.py installs those
    #: of the tiers it runs into ``.venv``): ``test`` alone builds nothing, so the unit
    #: tests and the checks install on a machine without a C library or a server.
    extras: tuple[str, ...] = ()
    #: Runs in the second lane, beside the first one's tiers (tests/run.py): it meets
    #: none of them on a Redis database (its own), a PostgreSQL or MariaDB database or a
    #: queue (each tier's own: ``run.tier_environment``) or a server port (those it
    #: starts take free ones).
    beside: bool = False


#: Redis databases, by who uses them (the lanes must not share one; tests/unit/test_tiers.py
#: checks the tiers' own): 0, 1 the first lane's tiers and tests/packaging; 6, 7 bench/
#: (bench/lib/common.py; its smoke tests run in postgres+redis); 2, 3 mariadb+redis; 8, 9
#: pgbouncer+redis; 10, 11 oldest; 12, 13 celery-compat; 14, 15 newest.
POSTGRES = {"IDEM_DATABASE": "postgres"}
MARIADB = {"IDEM_DATABASE": "mysql"}
#: Worker tests of publishing, canvas, task options, beat, the leader and metrics: the
#: same celery-idem code whatever the database and broker (their SQL is in tests/db, run
#: on every database). CI runs them on PostgreSQL + Redis; --full on SQLite and MariaDB too.
SAME_ON_EVERY_STACK = tuple(f"tests/integration/test_{name}.py" for name in (
    "beat", "call_paths", "celery_published", "leader", "metrics", "publish_paths",
    "pydantic", "replace_check", "retry_arguments", "send_task_keys", "untyped"))
#: The other worker tests: duplicates, crashes, recovery, the outbox, batches, the stored
#: message, large arguments, recipes, steps, and each database's own (the rest skip).
STACK_WORKER_TESTS = tuple(sorted(
    str(path.relative_to(ROOT)) for path in (ROOT / "tests" / "integration").glob("test_*.py")
    if str(path.relative_to(ROOT)) not in SAME_ON_EVERY_STACK))
TIERS = [
    Tier("unit", "unit tests: no database, no services (the fastest useful subset)",
         ("tests/unit",)),
    Tier("sqlite", "SQLite (WAL) + celery-idem's filesystem transport: database tests, "
         "the admin in headless Chromium, the worker tests of duplicates, crashes, recovery, "
         "the outbox, batches and the stored message (the demo small among them; the "
         "worker tests that run the same code on every stack with --full)",
         ("tests/db", "tests/browser", *STACK_WORKER_TESTS), {"IDEM_DATABASE": "sqlite"},
         full_paths=SAME_ON_EVERY_STACK, beside=True, extras=("beat", "docs")),
    Tier("postgres+redis", "PostgreSQL + Redis: database tests (native SQL and portable "
         "backends), real workers on every pool, every benchmark suite at a tiny size (on "
         "PgBouncer and MariaDB too with --full), the chaos suite small",
         ("tests/db", *STACK_WORKER_TESTS, *SAME_ON_EVERY_STACK, "tests/bench/test_bench_smoke.py",
          "tests/chaos"),
         {**POSTGRES, "IDEM_BROKER": f"{REDIS}/0", "IDEM_RESULTS": f"{REDIS}/1"},
         ("postgres", "redis", "rabbitmq"), extras=("beat", "bench"),
         full_paths=("tests/bench/test_bench_stacks.py",)),
    Tier("postgres+rabbitmq", "PostgreSQL + RabbitMQ: the worker tests whose outcome rests "
         "on the broker (marked `pools` or `delivery`; all of them with --full), the chaos "
         "suite small with --full", ("tests/integration",),
         {**POSTGRES, "IDEM_BROKER": RABBITMQ, "IDEM_RESULTS": f"{REDIS}/1"},
         ("postgres", "rabbitmq", "redis"), markers="pools or delivery or not worker",
         extras=("beat",), full_paths=("tests/chaos",)),
    Tier("mariadb+redis", "MariaDB (Django's mysql backend, mysqlclient) + Redis: the "
         "MySQL backend and the portable one, the migrations, the admin (in a browser too), "
         "the worker tests of duplicates, crashes, recovery, the outbox, batches and the "
         "stored message (the worker tests that run the same code on every stack and the "
         "chaos suite small on a mariadbd of its own, Debian's mariadb-server binaries, "
         "with --full)",
         ("tests/db", "tests/browser/test_admin_browser.py", *STACK_WORKER_TESTS),
         # Redis databases of its own: it runs beside the PostgreSQL tiers.
         {**MARIADB, "IDEM_MYSQL_DRIVER": "mysqlclient", "IDEM_BROKER": f"{REDIS}/2",
          "IDEM_RESULTS": f"{REDIS}/3"}, ("mariadb", "redis"),
         full_paths=(*SAME_ON_EVERY_STACK, "tests/chaos"), beside=True,
         extras=("mysql", "beat")),
    Tier("mariadb-pymysql", "MariaDB on the other driver, PyMySQL: the backend contract, "
         "the claims and their races",
         ("tests/db/test_backend_contract.py", "tests/db/test_claims.py",
          "tests/db/test_race.py", "tests/db/test_mysql.py"),
         # In the first lane: it shares nothing with it (no broker), and the second is longer.
         {**MARIADB, "IDEM_MYSQL_DRIVER": "pymysql"}, ("mariadb",)),
    *(Tier(name, f"the {name} supported stack ({about}) in .venv-{name} (tests/venvs.py): "
           "unit tests, the model test, the migrations check and the worker tests marked "
           "`pools` on prefork and gevent (every pool with --full), and those of Django's "
           "Tasks framework (`django_tasks`: skipped before Django 6.0), on PostgreSQL + "
           "Redis (tox runs the whole matrix)",
           ("tests/unit", "tests/db/test_model.py", "tests/integration"),
           {**POSTGRES, "IDEM_BROKER": f"{REDIS}/{redis}",
            "IDEM_RESULTS": f"{REDIS}/{redis + 1}", "IDEM_POOLS": "prefork,gevent"},
           ("postgres", "redis"), stack=name, markers="pools or django_tasks or not worker",
           beside=True)
      for name, about, redis in [("oldest", "Python 3.11, Django 5.2, Celery 5.5", 10),
                                 ("newest", "Python 3.13, Django 6.1, Celery 5.7", 14)]),
    # Django 6.1's backend runs in CI (newest, PostgreSQL + Redis); Django 6.0 (whose @task
    # takes no backend options) and the embedded default with --full.
    Tier("django60", "Django's Tasks framework on Django 6.0 (Python 3.12, Celery 5.6) in "
         ".venv-django60 (tests/venvs.py), on the embedded default (SQLite + celery-idem's "
         "filesystem transport): CeleryIdemBackend's unit tests and its real-worker tests "
         "(Django 6.1 on PostgreSQL + Redis is the newest tier's; tox runs the rest)",
         ("tests/unit/test_tasks_backend.py", "tests/integration/test_django_tasks.py"),
         {"IDEM_DATABASE": "sqlite"}, stack="django60", full_only=True, beside=True),
    Tier("pgbouncer+redis", "PostgreSQL behind a PgBouncer of its own in transaction "
         "pooling mode (tests/services/pgbouncer.py; Debian's pgbouncer) + Redis: the worker "
         "tests of duplicates, replays, atomic mode, the outbox, batches, recovery, crashes and "
         "worker liveness on prefork and gevent, the recovery pass's database tests, the chaos "
         "suite small behind a PgBouncer and a PostgreSQL of its own, both restarted (more "
         "with --full)",
         tuple([f"tests/integration/test_{name}.py" for name in (
             "pooler", "duplicates", "outbox", "batching", "recovery", "handback", "steps",
             "worker_connections", "liveness")] + [f"tests/db/test_{name}.py" for name in (
                 "reaper_stale_claims", "reaper_lost_messages", "reaper_passes",
                 "reaper_beat", "reaper_hooks", "envelope_recovery", "handback_paths",
                 "liveness")] + ["tests/chaos/test_chaos.py"]),
         {**POSTGRES, "IDEM_BROKER": f"{REDIS}/8", "IDEM_RESULTS": f"{REDIS}/9"},
         ("postgres", "redis"), server="pgbouncer", beside=True, extras=("beat",),
         full_paths=tuple(f"tests/integration/test_{name}.py" for name in (
             "envelope", "call_paths", "publish_paths", "beat"))),
    Tier("celery-compat", "Celery's own integration suite (test_tasks.py, test_canvas.py "
         "from the installed Celery's sdist, downloaded at test time) plain and with "
         "IdempotentTask as every task's base, once per key kind, compared per test "
         "against tests/compat/allowed.toml (its quick tests; all of them with --full)",
         ("tests/compat",), {**POSTGRES, "IDEM_BROKER": f"{REDIS}/12",
                             "IDEM_RESULTS": f"{REDIS}/13"}, ("postgres", "redis"),
         # Beside the first lane, which is the longer without it (about 31 minutes to 25
         # in a run of every tier one at a time on a 2-core machine).
         beside=True),
    Tier("wheel", "the sdist and wheel built and checked, the wheel installed with its "
         "extras into a fresh virtualenv, a project outside the checkout set up as the "
         "README says on PostgreSQL, behind PgBouncer and on MariaDB: duplicates, a replay "
         "and a killed worker (tests/packaging)", ("tests/packaging",), {},
         ("postgres", "redis", "mariadb")),
]
#: The static checks: (name, command). Each counts as one test and fails the run when
#: it fails.
CHECKS = [
    ("ruff", ["-m", "ruff", "check", "celery_idem", "tests", "bench", "django_app",
              "example_project"]),
    ("mypy", ["-m", "mypy"]),
    ("migrations", ["-m", "django", "makemigrations", "--check", "--dry-run",
                    "--settings=django_app.settings"]),
    # The demo's shop (example_project/) is a project of its own, with its own settings.
    ("shop migrations", ["-m", "django", "makemigrations", "--check", "--dry-run",
                         "--pythonpath=example_project", "--settings=shop.settings"]),
    # The documentation site (mkdocs.yml, the `docs` extra: pure Python) built with
    # warnings as errors: a broken link, anchor or API reference fails it.
    ("docs", ["-m", "mkdocs", "build", "--strict", "--site-dir",
              "{workdir}/site"]),
]
CHECKS_TIER = "checks"
