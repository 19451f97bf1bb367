"""Pick the job-store backend for a database alias by its vendor.

Everything in celery-idem reaches the job store through ``get_backend``, so one switch
(``celery_idem.testing.use_backend``) changes it for the whole library.
"""

from __future__ import annotations

from functools import cache

from django.db import connections

from ..installation import require_installed
from .base import Backend
from .lost import lost_connection
from .values import Change, Claimant, ClaimOutcome, Intent, JobRow

__all__ = ["Backend", "Change", "ClaimOutcome", "Claimant", "Intent", "JobRow", "get_backend",
           "lost_connection", "override"]

#: A backend that replaces every other one (celery_idem.testing.use_backend).
_override: list[Backend] = []


def get_backend(alias: str, dedicated: bool = False) -> Backend:
    """The backend for ``alias``: one-statement SQL on PostgreSQL; on MySQL/MariaDB the
    ORM with named queries for the intent, claim, commit and row read; the ORM elsewhere.

    ``dedicated``: on PostgreSQL, run on the process's own bookkeeping connection
    (``celery_idem.connection``) instead of Django's; only for autocommitted writes that
    need not share a transaction with the caller. Ignored on other databases.
    """
    if _override:
        return _override[-1]
    return _native(alias, dedicated)


@cache
def _native(alias: str, dedicated: bool) -> Backend:
    require_installed()  # before the models are imported
    if connections[alias].vendor == "postgresql":
        from .postgresql import PostgreSQLBackend

        return PostgreSQLBackend(alias, dedicated)
    if connections[alias].vendor == "mysql":
        from .mysql import MySQLBackend

        return MySQLBackend(alias)
    from .generic import GenericBackend

    return GenericBackend(alias)


def override(backend: Backend | None) -> None:
    """Make ``backend`` the one every caller gets (None: drop the last override)."""
    if backend is None:
        _override.pop()
    else:
        _override.append(backend)
