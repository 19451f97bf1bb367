"""The job admin: a fast list, a read-only detail page, and the operator actions.

Jobs are records, not forms: nobody adds, edits or deletes them here. The operator
actions (retry, release, resolve, forget) each need their own permission and call the
domain functions in ``celery_idem.actions``; the detail page's buttons post to the same
changelist actions, so there is one code path for one job or many.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.db.models import Q
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from .. import states
from ..conf import settings
from ..models import Job
from . import display
from .changelist import (
    ClaimFilter,
    DeadLetteredFilter,
    JobChangeList,
    StateCountPaginator,
    TaskNameFilter,
    counted_states,
    key_prefix,
)
from .operations import OperatorActions
from .timeline import attempts, timeline

#: How many child jobs the detail page links; the rest are one changelist link away.
CHILDREN_SHOWN = 20
#: The characters of a long key, task name or worker the list shows (head, tail) around
#: an ellipsis: a key's start names its kind and its end tells keys apart; a task's (or a
#: namespace's) end is its name; a worker's start is its host.
KEY_SHOWN = (15, 10)
NAME_SHOWN = (4, 24)
WORKER_SHOWN = (18, 0)


def _moment(field: str, label: Any) -> Any:
    """A detail-page field that shows ``field`` with how long ago (or how soon) it is."""

    @admin.display(description=label)
    def show(self: Any, job: Job) -> Any:
        return display.moment(getattr(job, field))

    return show


class JobAdmin(OperatorActions):
    # Narrow enough for a laptop's list beside the admin's sidebar and the filters: the
    # task under its key, long keys and names cut in the middle (whole on hover and on
    # the detail page), a failure's reason one line under its state; when it was created
    # (the list's order) and how long it ran are on the detail page.
    list_display = ("key_column", "state_column", "attempt", "worker_column", "updated_column")
    list_display_links = ("key_column",)
    list_filter = ("state", ClaimFilter, DeadLetteredFilter, TaskNameFilter,
                   ("created_at", admin.DateFieldListFilter))
    # Searched by get_search_results: key prefix (which covers the exact key) or task id.
    search_fields = ("key", "task_id")
    search_help_text = gettext_lazy("A key, the start of a key, or a Celery task id.")
    ordering = ("-created_at",)
    # Only orderings that an index serves.
    sortable_by = ("key_column",)
    show_full_result_count = False
    list_per_page = 50
    if hasattr(admin, "ShowFacets"):  # Django 5.0+: facets would count every filter choice
        show_facets = admin.ShowFacets.NEVER

    fieldsets = (
        (None, {"fields": ("key", "namespace", "task_name", "state_display", "attempt",
                           "worker", "task_id_display", "resent_display", "fingerprint",
                           "parent_display", "children_display")}),
        (gettext_lazy("Timing"), {"fields": ("created_display", "started_display",
                                             "finished_display", "duration_display",
                                             "lease_display", "not_before_display",
                                             "expires_display", "sent_display",
                                             "updated_display")}),
        (gettext_lazy("Arguments"), {"fields": ("args_display", "kwargs_display",
                                                "options_display", "message_display")}),
        (gettext_lazy("Outcome"), {"fields": ("result_display", "error_display")}),
    )
    readonly_fields = ("state_display", "task_id_display", "resent_display", "parent_display",
                       "children_display", "created_display", "started_display",
                       "finished_display", "duration_display", "lease_display",
                       "not_before_display", "expires_display", "sent_display",
                       "updated_display", "message_display",
                       "args_display", "kwargs_display", "options_display", "result_display",
                       "error_display")

    class Media:
        css = {"all": ["celery_idem/admin.css"]}

    # -- Read only ---------------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # "forget" is the deletion, behind its own permission

    # -- The list ----------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).using(settings.DATABASE)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[JobChangeList]:
        return JobChangeList

    def get_paginator(self, request: HttpRequest, queryset: Any, per_page: int,
                      orphans: int = 0, allow_empty_first_page: bool = True) -> Any:
        if queryset.model is not Job:  # the history page pages the admin's log entries
            return super().get_paginator(request, queryset, per_page, orphans,
                                         allow_empty_first_page)
        states, sampled = counted_states(request.GET)
        return StateCountPaginator(queryset, per_page, orphans, allow_empty_first_page,
                                   states=states, sampled=sampled)

    def get_search_results(self, request: HttpRequest, queryset: Any,
                           search_term: str) -> tuple[Any, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        # Case-sensitive on purpose: keys are identifiers, and the key index serves it.
        return queryset.filter(Q(**key_prefix(term)) | Q(task_id=term)), False

    @admin.display(description=gettext_lazy("key and task"), ordering="key")
    def key_column(self, job: Job) -> Any:
        task = display.shortened(job.task_name, *NAME_SHOWN)
        if job.namespace != job.task_name:
            task = format_html("{} · {}", task, display.shortened(job.namespace, *NAME_SHOWN))
        return format_html('{}<br><small class="idem-muted">{}</small>',
                           display.shortened(job.key, *KEY_SHOWN), task)

    @admin.display(description=gettext_lazy("state"))
    def state_column(self, job: Job) -> Any:
        badge = display.state_badge(job.state, stale=display.is_stale(job),
                                    in_transaction=getattr(job, "in_transaction", False))
        error = display.error_line(getattr(job, "error_type", None),
                                   getattr(job, "error_message", None))
        return format_html("{}<br>{}", badge, error) if error else badge

    @admin.display(description=gettext_lazy("worker"))
    def worker_column(self, job: Job) -> Any:
        return display.shortened(job.worker, *WORKER_SHOWN) or self.get_empty_value_display()

    @admin.display(description=gettext_lazy("last update"))
    def updated_column(self, job: Job) -> Any:
        return display.since(job.updated_at)

    # -- The detail page ---------------------------------------------------------------------

    @admin.display(description=gettext_lazy("state"))
    def state_display(self, job: Job) -> Any:
        if job.state == states.State.PENDING:  # only such a row can be an atomic body's
            display.mark_running_atomic([job])
        return display.state_badge(job.state, stale=display.is_stale(job),
                                   in_transaction=getattr(job, "in_transaction", False))

    @admin.display(description=gettext_lazy("Celery task id"))
    def task_id_display(self, job: Job) -> Any:
        url = display.task_result_url(job.task_id)
        if url:
            return format_html('<code>{}</code> <a href="{}">{}</a>', job.task_id, url,
                               _("task result"))
        return format_html("<code>{}</code>", job.task_id) if job.task_id else ""

    def _link(self, job: Job) -> Any:
        url = reverse(f"{self.admin_site.name}:celery_idem_job_change", args=[job.pk])
        return format_html('<a href="{}">{}</a> <small class="idem-muted">{} · {}</small>',
                           url, job.key, job.task_name, job.state)

    @admin.display(description=gettext_lazy("parent job"))
    def parent_display(self, job: Job) -> Any:
        parent = None if job.parent_id is None else (
            Job.objects.using(settings.DATABASE).filter(pk=job.parent_id).first())
        return self._link(parent) if parent is not None else self.get_empty_value_display()

    @admin.display(description=gettext_lazy("child jobs"))
    def children_display(self, job: Job) -> Any:
        """The jobs this job's body sent, the first few linked, with their count."""
        children = Job.objects.using(settings.DATABASE).filter(parent=job).order_by("id")
        shown = list(children[:CHILDREN_SHOWN + 1])
        if not shown:
            return self.get_empty_value_display()
        links = format_html_join(mark_safe("<br>"), "{}",
                                 ((self._link(c),) for c in shown[:CHILDREN_SHOWN]))
        if len(shown) > CHILDREN_SHOWN:
            url = reverse(f"{self.admin_site.name}:celery_idem_job_changelist")
            more = _("all %(count)d children") % {"count": children.count()}
            return format_html('{}<br><a href="{}?parent__id__exact={}">{}</a>', links, url,
                               job.pk, more)
        return links

    created_display = _moment("created_at", gettext_lazy("created at"))
    started_display = _moment("started_at", gettext_lazy("started at"))
    finished_display = _moment("finished_at", gettext_lazy("finished at"))
    not_before_display = _moment("not_before", gettext_lazy("not before"))
    updated_display = _moment("updated_at", gettext_lazy("updated at"))
    expires_display = _moment("expires_at", gettext_lazy("message expires at"))

    @admin.display(description=gettext_lazy("message sent at"))
    def sent_display(self, job: Job) -> Any:
        return display.sent(job)

    @admin.display(description=gettext_lazy("re-sent"))
    def resent_display(self, job: Job) -> str:
        return display.resends(job.dispatch_count)

    @admin.display(description=gettext_lazy("message as published"))
    def message_display(self, job: Job) -> Any:
        return display.pretty_json(job.message)

    @admin.display(description=gettext_lazy("duration"))
    def duration_display(self, job: Job) -> str:
        return display.run_time(job)

    @admin.display(description=gettext_lazy("lease expires at"))
    def lease_display(self, job: Job) -> Any:
        return display.lease(job.lease_expires_at)

    def _arguments(self, value: Any, job: Job) -> Any:
        if job.args is None and job.kwargs is None:
            return _("not stored (CELERY_IDEM_STORE_ARGUMENTS is off)")
        return display.pretty_json(value)

    @admin.display(description=gettext_lazy("positional arguments"))
    def args_display(self, job: Job) -> Any:
        return self._arguments(job.args, job)

    @admin.display(description=gettext_lazy("keyword arguments"))
    def kwargs_display(self, job: Job) -> Any:
        return self._arguments(job.kwargs, job)

    @admin.display(description=gettext_lazy("delivery options"))
    def options_display(self, job: Job) -> Any:
        return display.pretty_json(job.options)

    @admin.display(description=gettext_lazy("result"))
    def result_display(self, job: Job) -> Any:
        return display.pretty_json(job.result)

    @admin.display(description=gettext_lazy("error"))
    def error_display(self, job: Job) -> Any:
        return display.error_block(job.error)

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> Any:
        context = dict(extra_context or {})
        job = self.get_object(request, unquote(object_id))
        if job is not None:
            checkpoints = [
                {"step": c.step, "attempt": c.attempt, "at": display.full_time(c.at),
                 "value": display.pretty_json(c.value)}
                for c in job.checkpoints.order_by("at", "id")
            ]
            history = list(job.transitions.all())
            context.update(
                timeline=timeline(job, history),
                attempts=attempts(job, history),
                checkpoints=checkpoints,
                job_actions=self._detail_actions(request, job, bool(checkpoints)),
                changelist_url=reverse(f"{self.admin_site.name}:celery_idem_job_changelist"),
                action_checkbox_name=helpers.ACTION_CHECKBOX_NAME,
            )
        return super().change_view(request, object_id, form_url, context)

    def _detail_actions(self, request: HttpRequest, job: Job,
                        has_steps: bool = False) -> list[dict[str, Any]]:
        """The action buttons the detail page offers for ``job`` to this user."""
        can_retry = self.has_retry_permission(request)
        offered = [
            ("retry_selected", _("Retry"), "reset", can_retry),
            # Only a job with completed steps has anything to start again from scratch.
            ("retry_from_scratch_selected", _("Retry from scratch"), "reset",
             can_retry and has_steps),
            ("send_now_selected", _("Send now"), "redispatched", can_retry),
            ("resolve_selected", _("Resolve…"), "resolved",
             self.has_resolve_permission(request)),
            ("release_selected", _("Release claim…"), "released",
             self.has_release_permission(request)),
        ]
        buttons = [(name, label) for name, label, event, allowed in offered
                   if allowed and states.applies(event, job.state)]
        if job.state in states.FORGETTABLE and self.has_forget_permission(request):
            buttons.append(("forget_selected", _("Forget…")))
        return [{"name": name, "label": label} for name, label in buttons]
