"""The Django admin for jobs: list, read-only history, and operator actions
(docs/how-to/admin.md), and the read-only page of leases."""

from __future__ import annotations

from django.contrib import admin

from ..models import Job, Lease
from .job import JobAdmin
from .leases import LeaseAdmin

admin.site.register(Job, JobAdmin)
admin.site.register(Lease, LeaseAdmin)

__all__ = ["JobAdmin", "LeaseAdmin"]
