"""celery-idem: exactly-once effects per idempotency key for Celery tasks in Django.

Safe to import before Django is set up; models live in ``celery_idem.models``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .batching import batch, publish_many
from .decorator import task
from .errors import (
    ArgumentsNotJSON,
    ClaimError,
    ClaimLost,
    ConfigurationError,
    IdempotencyError,
    InProgress,
    InvalidKey,
    InvalidLease,
    InvalidStep,
    InvalidTransition,
    KeyMismatch,
    LeaseLost,
    MissingKey,
    NotMigrated,
    PersistenceError,
    ResultNotJSON,
    StepNotJSON,
    StoredFailure,
)
from .idempotent_task import IdempotentTask
from .installation import check_installed  # noqa: F401 - registers the check
from .keys import ALL_ARGUMENTS, PER_CALL
from .leader import LeaderTask

try:
    __version__ = version("celery-idem")
except PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0.0.0"

__all__ = [
    # the short declaration, the task base class and its key sources
    "task",
    "IdempotentTask",
    "ALL_ARGUMENTS",
    "PER_CALL",
    # leader-owned coordinators (celery_idem.leases for the leases themselves)
    "LeaderTask",
    # publishing many tasks: one intent statement per batch (celery_idem.batching)
    "batch",
    "publish_many",
    # errors
    "IdempotencyError",
    "ArgumentsNotJSON",
    "ClaimError",
    "ClaimLost",
    "ConfigurationError",
    "InProgress",
    "InvalidKey",
    "InvalidLease",
    "InvalidTransition",
    "KeyMismatch",
    "LeaseLost",
    "MissingKey",
    "NotMigrated",
    "PersistenceError",
    "ResultNotJSON",
    "InvalidStep",
    "StepNotJSON",
    "StoredFailure",
    "__version__",
]
