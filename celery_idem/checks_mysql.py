"""System checks for a MySQL/MariaDB job database: the settings under which the portable
backend's claim and fencing would be wrong there. Ids and fixes in docs/reference/checks.md
("MariaDB and MySQL", "System checks"). Registered by ``CeleryIdemConfig.ready()``.

What is not checked here, because something else already says it: strict mode (Django's
own ``mysql.W002``: without it an out-of-range or too long value is silently cut), and
the server's SKIP LOCKED (without it, MariaDB < 10.6 and MySQL < 8.0.1, concurrent
recovery passes wait for each other's batch instead of skipping it: slower, not wrong).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.db import connections

from .check_ids import CHECKS
from .checks import TAG
from .conf import settings

#: MySQLdb.constants.CLIENT.FOUND_ROWS (PyMySQL's is the same): UPDATE reports the rows
#: it matched, not only those it changed.
FOUND_ROWS = 2


def mysql_options(config: dict[str, Any]) -> dict[str, Any] | None:
    """The OPTIONS of a database's ``config`` if it is MySQL/MariaDB, else None."""
    if "mysql" not in config.get("ENGINE", ""):
        return None
    return dict(config.get("OPTIONS") or {})


@checks.register(TAG)
def check_mysql_options(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E010: the client flags drop FOUND_ROWS; W010: REPEATABLE READ."""
    alias = settings.DATABASE
    options = mysql_options(django_settings.DATABASES.get(alias, {}))
    return [] if options is None else option_messages(alias, options)


def option_messages(alias: str, options: dict[str, Any]) -> list[checks.CheckMessage]:
    """E010 and W010 for a MySQL database ``alias`` with these OPTIONS."""
    messages: list[checks.CheckMessage] = []
    flag = options.get("client_flag")
    if flag is not None and not int(flag) & FOUND_ROWS:
        messages.append(CHECKS["E010"](
            f"DATABASES[{alias!r}]['OPTIONS']['client_flag'] replaces Django's "
            "CLIENT.FOUND_ROWS: an UPDATE then counts only the rows it changed, so a "
            "fenced write that changes nothing (a checkpoint's owner check) reads as a "
            "lost claim",
            hint="Include it: 'client_flag': CLIENT.FOUND_ROWS | <your flags> "
                 "(from MySQLdb.constants import CLIENT)."))
    level = str(options.get("isolation_level") or "read committed").lower()
    if level == "repeatable read":
        messages.append(CHECKS["W010"](
            f"DATABASES[{alias!r}] runs at REPEATABLE READ: a claim that loses inside a "
            "transaction that already read (an atomic body's caller, eager apply() in "
            "atomic()) reads the row as the transaction's first read saw it, not the "
            "winner's outcome, and decides on that",
            hint=f"Set DATABASES[{alias!r}]['OPTIONS']['isolation_level'] = "
                 "'read committed' (Django's default for MySQL)."))
    return messages


@checks.register(TAG, checks.Tags.database)
def check_mysql_engine(app_configs: Any = None, databases: Iterable[str] | None = None,
                       **kwargs: Any) -> list[checks.CheckMessage]:
    """E011 (with ``check --database``, and at migrate): the job table is not InnoDB."""
    alias = settings.DATABASE
    if (mysql_options(django_settings.DATABASES.get(alias, {})) is None
            or alias not in (databases or ())):
        return []
    tables = _tables()
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES "
                       "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN "
                       f"({', '.join(['%s'] * len(tables))})", tables)
        # Tables not there yet (not migrated) are not listed.
        wrong = sorted(f"{name} ({engine})" for name, engine in cursor.fetchall()
                       if str(engine).lower() != "innodb")
    if not wrong:
        return []
    return [CHECKS["E011"](
        f"celery_idem's tables on {alias!r} are not InnoDB: {', '.join(wrong)}. Without "
        "transactions and row locks an atomic body's writes are kept when its claim is "
        "lost, and concurrent claims and recovery passes are not isolated",
        hint="ALTER TABLE <table> ENGINE=InnoDB for each; make InnoDB the server's "
             "default_storage_engine.")]


def _tables() -> list[str]:
    """The tables of celery_idem's models."""
    from django.apps import apps

    return [m._meta.db_table for m in apps.get_app_config("celery_idem").get_models()]
