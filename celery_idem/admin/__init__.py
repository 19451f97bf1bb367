"""The Django admin for jobs: list, read-only history, and operator actions (docs/admin.md)."""

from __future__ import annotations

from django.contrib import admin

from ..models import Job
from .job import JobAdmin

admin.site.register(Job, JobAdmin)

__all__ = ["JobAdmin"]
