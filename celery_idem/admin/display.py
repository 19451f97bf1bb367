"""How the admin shows a job's values: state badges, short durations, pretty JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.apps import apps
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from ..states import State, lease_expired


def state_badge(value: str | None, *, stale: bool = False,
                in_transaction: bool = False) -> SafeString:
    """A coloured badge whose text names the state, so it reads without colour too.
    ``in_transaction``: a PENDING row an atomic body is running (``mark_running_atomic``)."""
    if in_transaction:
        return format_html('<span class="idem-state idem-state--running">{}</span>',
                           _("Running (atomic, in transaction)"))
    if not value:
        return format_html('<span class="idem-state idem-state--none">{}</span>', _("none"))
    try:
        label = State(value).label
    except ValueError:  # a value this version does not know: show it as it is
        label = value
    if stale:
        return format_html(
            '<span class="idem-state idem-state--{} idem-state--stale">{}</span>',
            value.lower(), _("%(state)s, stale claim") % {"state": label},
        )
    return format_html('<span class="idem-state idem-state--{}">{}</span>', value.lower(), label)


def shortened(text: str, head: int, tail: int = 0) -> SafeString | str:
    """``text`` cut to its first ``head`` and last ``tail`` characters around an ellipsis
    when it is longer, in a span whose title (a tooltip) is the whole text: the list's
    CSS may cut it further to fit its column."""
    if not text:
        return ""
    if len(text) <= head + tail + 1:
        return format_html('<span title="{}">{}</span>', text, text)
    return format_html('<span class="idem-short" title="{}">{}…{}</span>', text, text[:head],
                       text[len(text) - tail:] if tail else "")


def error_line(error_type: str | None, message: str | None) -> SafeString | str:
    """An error's type and reason on one line cut by the list's CSS, whole in its title."""
    if not error_type and not message:
        return ""
    text = f"{error_type}: {message}" if error_type and message else error_type or message
    return format_html('<span class="idem-error-line" title="{}">{}</span>', text, text)


def sent(job: Any) -> SafeString | str:
    """When the job's message was last sent, or that it has not left yet."""
    if job.sent_at is not None:
        return moment(job.sent_at)
    if job.attempt:  # claimed before the sender marked it sent: it certainly left
        return _("sent (claimed before it was marked sent)")
    return format_html('{} <span class="idem-muted">({})</span>', _("not sent yet"),
                       _("recovery sends it after CELERY_IDEM_NEVER_SENT_TIMEOUT"))


def resends(count: int) -> str:
    """How often the job's message was sent again (by recovery or an operator)."""
    if not count:
        return _("not re-sent")
    return ngettext("re-sent %(count)d time", "re-sent %(count)d times", count) % {
        "count": count}


def short_duration(seconds: float, *, coarse: bool = False) -> str:
    """A compact duration: "850 ms", "12.5 s", "4 min 3 s", "2 h 5 min", "3 d 4 h".

    ``coarse`` (for how long ago something was) drops what is below a second or, past a
    minute, below a minute.
    """
    seconds = max(seconds, 0.0)
    if coarse and seconds < 60:
        return _("%(s)d s") % {"s": seconds}
    if seconds < 1:
        return _("%(ms)d ms") % {"ms": round(seconds * 1000)}
    if seconds < 60:
        return _("%(s).1f s") % {"s": seconds}
    whole = int(seconds)
    if whole < 3600:
        if coarse:
            return _("%(m)d min") % {"m": whole // 60}
        return _("%(m)d min %(s)d s") % {"m": whole // 60, "s": whole % 60}
    if whole < 86400:
        return _("%(h)d h %(m)d min") % {"h": whole // 3600, "m": whole % 3600 // 60}
    return _("%(d)d d %(h)d h") % {"d": whole // 86400, "h": whole % 86400 // 3600}


def full_time(value: datetime) -> str:
    """The local date and time to the second, for a tooltip or a table cell."""
    return date_format(timezone.localtime(value), "Y-m-d H:i:s T")


def since(value: datetime | None, now: datetime | None = None) -> SafeString | str:
    """How long ago ``value`` was, with the exact time as a tooltip."""
    if value is None:
        return ""
    now = now or timezone.now()
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', value.isoformat(), full_time(value),
        _("%(duration)s ago") % {
            "duration": short_duration((now - value).total_seconds(), coarse=True)},
    )


def moment(value: datetime | None, now: datetime | None = None) -> SafeString | str:
    """The exact time, then how long ago (or how soon) it is."""
    if value is None:
        return ""
    left = (value - (now or timezone.now())).total_seconds()
    relative = (_("in %(duration)s") if left > 0 else _("%(duration)s ago")) % {
        "duration": short_duration(abs(left), coarse=True)}
    return format_html('{} <span class="idem-muted">({})</span>', full_time(value), relative)


def lease(expires: datetime | None, now: datetime | None = None) -> SafeString | str:
    """When a claim's lease ends, and whether it already has."""
    if expires is None:
        return ""
    left = (expires - (now or timezone.now())).total_seconds()
    when = (_("expired %(duration)s ago") if left < 0 else _("in %(duration)s")) % {
        "duration": short_duration(abs(left), coarse=True)}
    return format_html("{} ({})", full_time(expires), when)


def run_time(job: Any, now: datetime | None = None) -> str:
    """How long the last attempt ran; "so far" while it is running."""
    if job.started_at is None:
        return ""
    if job.finished_at is not None:
        return short_duration((job.finished_at - job.started_at).total_seconds())
    if job.state == State.RUNNING:
        elapsed = ((now or timezone.now()) - job.started_at).total_seconds()
        return _("%(duration)s so far") % {"duration": short_duration(elapsed)}
    return ""


def is_stale(job: Any, now: datetime | None = None) -> bool:
    """RUNNING past its lease (``states.lease_expired``)."""
    return lease_expired(job.state, job.lease_expires_at, now or timezone.now())


def pretty_json(value: Any) -> SafeString | str:
    """Indented JSON in a <pre> block; empty when there is nothing stored."""
    if value is None:
        return ""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="idem-json">{}</pre>', text)


def error_block(error: dict[str, Any] | None) -> SafeString | str:
    """The stored error: type and message, then the traceback folded in <details>."""
    if not error:
        return ""
    name = error.get("type") or _("Error")
    if error.get("module") and error["module"] != "builtins":
        name = f"{error['module']}.{name}"
    head: str = format_html('<p class="idem-error"><strong>{}</strong>: {}</p>', name,
                       error.get("message", ""))
    extra = {k: v for k, v in error.items() if k not in {"type", "module", "message", "traceback"}}
    if extra:
        head += pretty_json(extra)
    if error.get("traceback"):
        head += format_html(
            '<details class="idem-traceback"><summary>{}</summary><pre>{}</pre></details>',
            _("Traceback"), error["traceback"],
        )
    return head


def task_result_url(task_id: str) -> str:
    """The django-celery-results admin page for ``task_id``, when that app is installed."""
    if not task_id or not apps.is_installed("django_celery_results"):
        return ""
    try:
        changelist = reverse("admin:django_celery_results_taskresult_changelist")
    except NoReverseMatch:  # installed, but its admin is not on this site
        return ""
    return f"{changelist}?{urlencode({'task_id': task_id})}"


def mark_running_atomic(jobs: Iterable[Any]) -> None:
    """Set ``in_transaction`` on each of ``jobs``: True for a PENDING one that an atomic
    body is running right now (its claim commits with the body: ``census
    .running_atomic``), which ``state_badge`` then shows as running."""
    from ..census import running_atomic
    from ..conf import settings

    jobs = list(jobs)
    # Every job of the page is asked about (the reader keeps the PENDING ones), so a
    # page takes the same queries whatever its states.
    ids = [job.id for job in jobs]
    held = {job.id for job in running_atomic(using=settings.DATABASE, ids=ids).jobs}
    for job in jobs:
        job.in_transaction = job.id in held
