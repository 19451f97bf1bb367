"""The read-only admin page of leases: who coordinates each shard, until when, with which
token (celery_idem.leases, LeaderTask)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy

from ..conf import settings
from . import display


class LeaseAdmin(admin.ModelAdmin):
    """Leases are written by their holders only: the page shows them, nothing edits them."""

    list_display = ("name", "holder", "token", "status_column", "expires_column",
                    "renewed_column", "skipped_ticks")
    list_display_links = ("name",)
    search_fields = ("name", "holder")
    ordering = ("name",)
    list_per_page = 100
    readonly_fields = ("name", "holder", "token", "status_column", "expires_column",
                       "acquired_at", "renewed_at", "skipped_ticks", "last_skipped_at")
    fields = readonly_fields

    class Media:
        css = {"all": ["celery_idem/admin.css"]}

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).using(settings.DATABASE)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Deleting a row would restart its tokens at 1 and let a stale holder's writes
        # pass the fencing check again.
        return False

    @admin.display(description=gettext_lazy("status"))
    def status_column(self, lease: Any) -> SafeString:
        if lease.is_live(timezone.now()):
            return format_html('<span class="idem-state idem-state--running">{}</span>',
                               gettext_lazy("live"))
        return format_html('<span class="idem-state idem-state--none">{}</span>',
                           gettext_lazy("expired"))

    @admin.display(description=gettext_lazy("expires"), ordering="expires_at")
    def expires_column(self, lease: Any) -> SafeString | str:
        return display.lease(lease.expires_at)

    @admin.display(description=gettext_lazy("renewed"), ordering="renewed_at")
    def renewed_column(self, lease: Any) -> SafeString | str:
        return display.since(lease.renewed_at)
