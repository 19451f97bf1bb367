"""The operator actions of the job admin: retry, send now, release, resolve and forget.

Each is a changelist action behind its own permission (``has_<name>_permission``) that
calls the domain function in ``celery_idem.actions`` per job and reports every outcome
with a plural-aware message. Release, resolve and forget show a confirmation page first;
it carries the attempt the operator saw, so a job that moved meanwhile is left alone.
The detail page's buttons post to these same actions, with ``next`` to come back.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.models import DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from .. import actions as domain
from .. import states
from ..conf import settings
from ..models import Checkpoint, Job, Transition
from ..states import State
from . import display
from . import messages as texts

#: The most jobs one action takes; bulk work beyond that belongs to a management command.
MAX_ACTION_JOBS = 500


class OperatorActions(admin.ModelAdmin):
    """The operator actions of a ModelAdmin; ``JobAdmin`` derives from it."""

    actions = ("retry_selected", "retry_from_scratch_selected", "send_now_selected",
               "release_selected", "resolve_selected", "forget_selected")

    def _has(self, request: HttpRequest, codename: str) -> bool:
        user: Any = request.user
        return bool(user.has_perm(f"{self.opts.app_label}.{codename}"))

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "retry_job")

    def has_release_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "release_job")

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "resolve_job")

    def has_forget_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "forget_job")

    def response_action(self, request: HttpRequest, queryset: Any, *args: Any,
                        **kwargs: Any) -> Any:
        # Without its permission an action is not even a choice; a crafted POST of one of
        # ours gets a plain refusal rather than Django's "No action selected".
        available = self.get_actions(request)
        for name in request.POST.getlist("action"):
            if name in self.actions and name not in available:
                raise PermissionDenied
        return super().response_action(request, queryset, *args, **kwargs)

    def _selected(self, request: HttpRequest, queryset: Any) -> list[Job] | None:
        jobs = list(queryset.defer(None)[:MAX_ACTION_JOBS + 1])
        if len(jobs) > MAX_ACTION_JOBS:
            text, level = texts.TOO_MANY
            self.message_user(request, text % {"count": MAX_ACTION_JOBS}, level)
            return None
        return jobs

    @staticmethod
    def _seen(request: HttpRequest) -> dict[str, int]:
        """The attempt of each job as the confirmation page showed it: {pk: attempt}."""
        seen = {}
        for value in request.POST.getlist("seen"):
            pk, _sep, attempt = value.partition(":")
            if attempt.isdigit():
                seen[pk] = int(attempt)
        return seen

    def _report(self, request: HttpRequest, results: list[domain.ActionResult],
                catalogue: dict[str, Any], key_of: Any = None) -> None:
        """One message per kind of outcome, with the count and the keys."""
        groups: dict[Any, list[domain.ActionResult]] = defaultdict(list)
        for result in results:
            groups[key_of(result) if key_of else result.outcome.value].append(result)
            if result.dispatch_error:
                groups["dispatch_failed"].append(result)
        for kind, members in groups.items():
            if kind == "dispatch_failed":
                text, level = texts.DISPATCH_FAILED
            elif kind == domain.Outcome.RACED.value:
                text, level = texts.RACED
            else:
                text, level = catalogue[kind]
            keys = [r.job.key for r in members]
            shown = ", ".join(keys[:5]) + (", …" if len(keys) > 5 else "")
            values = {"count": len(members), "keys": shown,
                      "error": members[0].dispatch_error}
            self.message_user(request, text % values, level)

    def _next(self, request: HttpRequest) -> HttpResponseRedirect | None:
        """Back to the page the action was started from (a job's detail page), if safe."""
        url = request.POST.get("next", "")
        if url and url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()},
                                                   require_https=request.is_secure()):
            return HttpResponseRedirect(url)
        return None

    @staticmethod
    def _retry_kind(result: domain.ActionResult) -> str:
        if result.outcome is domain.Outcome.WRONG_STATE and result.job.state == State.SUCCEEDED:
            return "succeeded"
        return result.outcome.value

    @admin.action(description=gettext_lazy("Retry selected failed or uncertain jobs"),
                  permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: Any) -> Any:
        return self._retry(request, queryset, clear_steps=False)

    @admin.action(description=gettext_lazy(
        "Retry selected failed or uncertain jobs from scratch (clear their completed steps)"),
        permissions=["retry"])
    def retry_from_scratch_selected(self, request: HttpRequest, queryset: Any) -> Any:
        return self._retry(request, queryset, clear_steps=True)

    def _retry(self, request: HttpRequest, queryset: Any, clear_steps: bool) -> Any:
        jobs = self._selected(request, queryset)
        if jobs is None:
            return None
        actor = request.user.get_username()
        results = [domain.retry(job, actor=actor, clear_steps=clear_steps) for job in jobs]
        self._report(request, results, texts.RETRY, self._retry_kind)
        return self._next(request)

    # Sending a pending job's message again repeats nothing a retry would not: the same
    # permission covers it.
    @admin.action(description=gettext_lazy("Send selected pending jobs to their queues now"),
                  permissions=["retry"])
    def send_now_selected(self, request: HttpRequest, queryset: Any) -> Any:
        jobs = self._selected(request, queryset)
        if jobs is None:
            return None
        actor = request.user.get_username()
        results = [domain.send_now(job, actor=actor) for job in jobs]
        self._report(request, results, texts.SEND_NOW)
        return self._next(request)

    @admin.action(description=gettext_lazy("Release the claim of selected running jobs…"),
                  permissions=["release"])
    def release_selected(self, request: HttpRequest, queryset: Any) -> Any:
        jobs = self._selected(request, queryset)
        if jobs is None:
            return None
        if request.POST.get("post") != "yes":
            now = timezone.now()
            rows = [{"job": job, "applies": states.applies("released", job.state),
                     "stale": states.lease_expired(job.state, job.lease_expires_at, now),
                     "lease": display.lease(job.lease_expires_at, now)} for job in jobs]
            return self._confirm(request, rows, "release_selected", _("Release claims"))
        seen, dispatch = self._seen(request), request.POST.get("dispatch") == "on"
        note, actor = request.POST.get("note", "").strip(), request.user.get_username()
        results = [domain.release(job, actor=actor, note=note, dispatch=dispatch,
                                   attempt=seen.get(str(job.pk))) for job in jobs]
        kind = "done" if dispatch else "done_kept"
        self._report(request, results, texts.RELEASE,
                     lambda r: kind if r.done else r.outcome.value)
        return self._next(request)

    @admin.action(description=gettext_lazy("Resolve selected uncertain jobs…"),
                  permissions=["resolve"])
    def resolve_selected(self, request: HttpRequest, queryset: Any) -> Any:
        jobs = self._selected(request, queryset)
        if jobs is None:
            return None
        can_retry = self.has_retry_permission(request)
        decision, note = request.POST.get("decision"), request.POST.get("note", "").strip()
        error = ""
        if request.POST.get("post") == "yes":
            if decision == "succeeded" and not note:
                error = _("Say how you know the effect happened: the note is required.")
            elif decision == "retry" and not can_retry:
                raise PermissionDenied
            elif decision in ("succeeded", "retry"):
                return self._resolve(request, jobs, decision, note)
        rows = [{"job": job, "applies": states.applies("resolved", job.state)} for job in jobs]
        return self._confirm(request, rows, "resolve_selected", _("Resolve uncertain jobs"),
                             can_retry=can_retry, error=error, note=note)

    def _resolve(self, request: HttpRequest, jobs: list[Job], decision: str, note: str) -> Any:
        seen, actor = self._seen(request), request.user.get_username()
        if decision == "retry":
            # Only uncertain jobs: this page does not retry a failed job by the way.
            results = [domain.retry(job, actor=actor, note=note, attempt=seen.get(str(job.pk)))
                       if job.state == State.UNCERTAIN
                       else domain.ActionResult(job, domain.Outcome.WRONG_STATE)
                       for job in jobs]
            self._report(request, results, {**texts.RETRY, "wrong_state": texts.RESOLVE[
                "wrong_state"]}, lambda r: r.outcome.value)
        else:
            results = [domain.resolve(job, actor=actor, note=note,
                                       attempt=seen.get(str(job.pk))) for job in jobs]
            self._report(request, results, texts.RESOLVE)
        return self._next(request)

    @admin.action(description=gettext_lazy("Forget selected jobs so their keys can run again…"),
                  permissions=["forget"])
    def forget_selected(self, request: HttpRequest, queryset: Any) -> Any:
        jobs = self._selected(request, queryset)
        if jobs is None:
            return None
        if request.POST.get("post") != "yes":
            ids = [job.pk for job in jobs]
            history = dict(Transition.objects.using(settings.DATABASE).filter(job__in=ids)
                           .values_list("job").annotate(n=Count("pk")))
            steps = dict(Checkpoint.objects.using(settings.DATABASE).filter(job__in=ids)
                         .values_list("job").annotate(n=Count("pk")))
            rows = [{"job": job, "applies": job.state in states.FORGETTABLE,
                     "transitions": history.get(job.pk, 0), "checkpoints": steps.get(job.pk, 0)}
                    for job in jobs]
            return self._confirm(request, rows, "forget_selected", _("Forget jobs"))
        seen, note = self._seen(request), request.POST.get("note", "").strip()
        actor = request.user.get_username()
        results = [domain.forget(job, actor=actor, note=note, attempt=seen.get(str(job.pk)))
                   for job in jobs]
        for result in results:
            if result.done:
                self._log_forgotten(request, result, note)
        self._report(request, results, texts.FORGET)
        return None  # the job's own page is gone: back to the list

    def _log_forgotten(self, request: HttpRequest, result: domain.ActionResult,
                       note: str) -> None:
        """The admin log keeps who forgot which job, since its history went with it."""
        counts = ", ".join(f"{n} {model}" for model, n in sorted(result.deleted.items()))
        message = f"Forgot the job (state {result.job.state}, attempt {result.job.attempt}); "
        message += f"deleted {counts}." + (f" Note: {note}" if note else "")
        user_id = request.user.pk
        assert user_id is not None  # the admin only lets logged-in staff act
        if hasattr(LogEntry.objects, "log_actions"):  # Django 5.1+
            LogEntry.objects.log_actions(user_id, [result.job], DELETION,
                                         change_message=message, single_object=True)
        else:  # pragma: no cover - Django < 5.1
            from django.contrib.contenttypes.models import ContentType

            content_type = ContentType.objects.get_for_model(result.job, for_concrete_model=False)
            LogEntry.objects.log_action(
                user_id, content_type.pk, result.job.pk, str(result.job), DELETION, message)

    def _confirm(self, request: HttpRequest, rows: list[dict[str, Any]], action: str,
                 title: str, **extra: Any) -> TemplateResponse:
        """The page that shows what an action will do and asks to go on.

        ``rows``: one dict per selected job: ``job``, ``applies`` (whether the action can
        act on it) and what the action's template shows besides.
        """
        context = {
            **self.admin_site.each_context(request),
            "title": title, "opts": self.opts, "media": self.media, "action": action,
            "rows": rows, "applicable": [row for row in rows if row["applies"]],
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "next": request.POST.get("next", ""), **extra,
        }
        template = f"admin/celery_idem/job/{action.removesuffix('_selected')}_confirmation.html"
        return TemplateResponse(request, template, context)
