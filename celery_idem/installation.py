"""Whether the project is set up for celery-idem: the app installed, its tables migrated.

The two setup steps a new project forgets, each caught with an error naming the fix at
the first use (``delay()``, a worker's claim) instead of Django's model-registry
``RuntimeError`` or the driver's "no such table"; the missing app by a system check too.
(No system check for the tables: ``migrate`` runs the database checks before it
migrates, so such a check would stop the very command that fixes it. Django's own
``runserver`` and ``migrate --check`` report unapplied migrations.)

The installed-app check is registered when ``celery_idem`` is imported (``checks.py``
is imported only by the app's ``ready()``, which never runs when the app is missing);
a project that follows the README imports ``celery_idem.beat`` in its settings.
"""

from __future__ import annotations

from typing import Any

from django.core import checks

from .check_ids import CHECKS
from .errors import ConfigurationError, NotMigrated

APP = "celery_idem"
INSTALL_HINT = f'Add "{APP}" to INSTALLED_APPS, then run manage.py migrate.'
#: The table every path reads first (the claim, the intent, the recovery pass).
JOB_TABLE = "celery_idem_job"
#: How each database says a table does not exist: SQLSTATE 42P01 (PostgreSQL),
#: error 1146 (MySQL/MariaDB), and SQLite's message (it has no error codes for it).
UNDEFINED_TABLE_SQLSTATE = "42P01"
MYSQL_NO_SUCH_TABLE = 1146
SQLITE_NO_SUCH_TABLE = "no such table"


def require_installed() -> None:
    """Raise ConfigurationError unless ``celery_idem`` is in INSTALLED_APPS (before its
    models are imported: Django would raise a RuntimeError about an app_label)."""
    from django.apps import apps

    if not apps.is_installed(APP):
        raise ConfigurationError(f"{APP} is not in INSTALLED_APPS: {INSTALL_HINT}")


def not_migrated(exc: BaseException) -> NotMigrated | None:
    """The NotMigrated error to raise for ``exc``, a database error, when it says that a
    celery-idem table does not exist; None for any other error."""
    from .conf import settings

    cause = exc.__cause__ or exc
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    code = next(iter(getattr(cause, "args", ())), None)  # MySQL: (code, message)
    missing = (
        sqlstate == UNDEFINED_TABLE_SQLSTATE
        or code == MYSQL_NO_SUCH_TABLE
        or str(cause).startswith(SQLITE_NO_SUCH_TABLE)
    )
    if not missing or "celery_idem_" not in str(cause):
        return None
    said = str(cause).splitlines()[0]  # PostgreSQL adds the statement's text below
    return NotMigrated(f"the celery-idem tables do not exist on database "
                       f"{settings.DATABASE!r} ({said}): {_migrate_hint(settings.DATABASE)}")


@checks.register(APP)
def check_installed(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E006: the app is missing from INSTALLED_APPS."""
    from django.apps import apps

    if apps.is_installed(APP):
        return []
    return [CHECKS["E006"](
        f"{APP} is imported but not in INSTALLED_APPS: idempotent tasks have no job "
        "tables, and the publish and worker hooks are not connected",
        hint=INSTALL_HINT)]


def _migrate_hint(alias: str) -> str:
    return f"run manage.py migrate{'' if alias == 'default' else f' --database {alias}'}"
