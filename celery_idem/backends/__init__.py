"""Pick the job-store backend for a database alias by its vendor."""

from __future__ import annotations

from functools import cache

from django.db import connections

from .base import Backend, Claimant, ClaimOutcome, Intent, JobRow

__all__ = ["Backend", "ClaimOutcome", "Claimant", "Intent", "JobRow", "get_backend"]


@cache
def get_backend(alias: str, dedicated: bool = False) -> Backend:
    """The backend for ``alias``: one-statement SQL on PostgreSQL, the ORM elsewhere.

    ``dedicated``: on PostgreSQL, run on the process's own bookkeeping connection
    (``celery_idem.connection``) instead of Django's; only for autocommitted writes that
    need not share a transaction with the caller. Ignored on other databases.
    """
    if connections[alias].vendor == "postgresql":
        from .postgresql import PostgreSQLBackend

        return PostgreSQLBackend(alias, dedicated)
    from .generic import GenericBackend

    return GenericBackend(alias)
