"""The job list's filters, and a changelist that counts per state, up to a cap.

On a table of a million jobs the list must not count the table. The summary at the top
counts each state under the current filter up to ``COUNT_LIMIT`` (one bounded query per
state, served by the (state, ...) indexes), and the paginator's count is their sum, so
the list makes no other count. Every filter and ordering here is served by an index.
"""

from __future__ import annotations

from collections import Counter
from functools import cached_property
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR, SEARCH_VAR, ChangeList
from django.core.paginator import Paginator
from django.db.models.fields.json import KT
from django.db.models.functions import Left
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..backends import get_backend
from ..states import State, live_q, stale_q
from . import display

#: Each state is counted up to this many jobs; the summary shows more as "10,000+".
COUNT_LIMIT = 10_000
#: Under a search or a date range, the states of this many matches are counted: each is
#: a read of a row wherever it lies (a key prefix's rows are spread over the table).
SAMPLE_LIMIT = 1_000
#: At most this many task names are offered in the task filter.
TASK_NAMES_LIMIT = 200
#: The characters of a failure's reason the list reads (its cell shows one line of them).
ERROR_SHOWN = 300
#: Sorts after any text that starts with a given prefix (for an index range scan).
_AFTER_PREFIX = chr(0x10FFFF)

def key_prefix(term: str) -> dict[str, str]:
    """Lookups for keys that start with ``term``, as a range that the key index serves.

    The range makes the index usable under any collation (a LIKE prefix needs the "C"
    collation on PostgreSQL); ``startswith`` keeps the match exact.
    """
    return {"key__gte": term, "key__lt": term + _AFTER_PREFIX, "key__startswith": term}


class ClaimFilter(admin.SimpleListFilter):
    """RUNNING jobs by their lease: stale (past it, the worker is presumed dead) or live."""

    title = _("claim")
    parameter_name = "claim"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("stale", _("Stale (running past its lease)")),
            ("live", _("Live (running within its lease)")),
        ]

    def queryset(self, request: Any, queryset: Any) -> Any:
        now = timezone.now()
        if self.value() == "stale":
            return queryset.filter(stale_q(now))
        if self.value() == "live":
            return queryset.filter(live_q(now))
        return queryset


class TaskNameFilter(admin.SimpleListFilter):
    """Jobs of one task; the choices come from the task index, not from a table scan."""

    title = _("task name")
    parameter_name = "task_name"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        names = get_backend(model_admin.get_queryset(request).db).task_names(TASK_NAMES_LIMIT)
        current = self.value()
        if current and current not in names:
            names.append(current)
        return [(name, name) for name in names]

    def queryset(self, request: Any, queryset: Any) -> Any:
        return queryset.filter(task_name=self.value()) if self.value() else queryset


class DeadLetteredFilter(admin.SimpleListFilter):
    """FAILED jobs the reaper gave up on after max_attempts (a dead_lettered history row)."""

    title = _("dead-lettered")
    parameter_name = "dead_lettered"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: Any, queryset: Any) -> Any:
        if self.value() == "yes":
            return queryset.dead_lettered()
        if self.value() == "no":
            return queryset.not_dead_lettered()
        return queryset


def counted_states(params: Any) -> tuple[frozenset[str], bool]:
    """What the summary counts under the list's query ``params``: the states its filters
    admit (the others are 0 without a query: a count under "state = SUCCEEDED" of the
    RUNNING jobs reads the RUNNING index for nothing), and whether to count a sample.

    A search or a date range is not served by the (state, ...) indexes: counting each
    rare state under it reads every job of that state. Then the summary counts the states
    of the newest SAMPLE_LIMIT + 1 matches, one query, as lower bounds past the cap.
    """
    states = {state.value for state in State}
    chosen = params.get("state__exact")
    if isinstance(chosen, list):  # Django 5+: lists of values
        chosen = chosen[-1] if chosen else None
    if chosen in states:
        states &= {chosen}
    if params.get("claim") in ("stale", "live"):
        states &= {State.RUNNING.value}
    if params.get("dead_lettered") == "yes":
        states &= {State.FAILED.value}
    sampled = bool(params.get(SEARCH_VAR)) or any(p.startswith("created_at__") for p in params)
    return frozenset(states), sampled


class StateCountPaginator(Paginator):
    """A paginator whose count is the sum of the per-state counts (each capped)."""

    def __init__(self, *args: Any, states: frozenset[str] = frozenset(State),
                 sampled: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.states, self.sampled = states, sampled

    @cached_property
    def state_counts(self) -> dict[str, int]:
        """Jobs per state under the filter, each counted up to COUNT_LIMIT + 1 (or, for a
        sampled filter, among its first SAMPLE_LIMIT + 1 matches)."""
        jobs: Any = self.object_list
        jobs = jobs.order_by()
        counts = dict.fromkeys((state.value for state in State), 0)
        if self.sampled:
            if self.states != frozenset(State):
                jobs = jobs.filter(state__in=self.states)
            # The newest matches, as the list shows them: read along the created_at
            # index, stopping at the cap (unordered, a key prefix OR a task id became a
            # bitmap of every match first).
            newest = jobs.order_by("-created_at").values_list("state", flat=True)
            counts.update(Counter(newest[:SAMPLE_LIMIT + 1]))
            return counts
        counts.update({state: jobs.filter(state=state).values("pk")[:COUNT_LIMIT + 1].count()
                       for state in self.states})
        return counts

    @cached_property
    def partial(self) -> bool:
        """Whether the counts are lower bounds: a sample that reached the cap."""
        return self.sampled and sum(self.state_counts.values()) > SAMPLE_LIMIT

    @cached_property
    def count(self) -> int:
        return sum(self.state_counts.values())


class JobChangeList(ChangeList):
    """The job changelist, with the per-state summary for the current filter."""

    def get_queryset(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # The list never reads the JSON columns, which may hold large tracebacks, nor the
        # stored message (~1 KB a job): of the error, only its type and the start of its
        # reason, for the state column.
        return super().get_queryset(request, *args, **kwargs).defer(
            "args", "kwargs", "result", "error", "options", "message").annotate(
            error_type=KT("error__type"),
            error_message=Left(KT("error__message"), ERROR_SHOWN))

    def get_results(self, request: Any) -> None:
        super().get_results(request)
        display.mark_running_atomic(self.result_list)  # the page's rows, evaluated once

    def state_summary(self) -> list[dict[str, Any]]:
        """Each state with its count under the current filter and a link that selects it."""
        counts = self.paginator.state_counts
        selected = self.params.get("state__exact")
        if isinstance(selected, list):  # Django 5+: lists of values
            selected = selected[-1] if selected else None
        return [
            {
                "value": state.value, "label": state.label,
                "count": min(counts[state.value], COUNT_LIMIT),
                "capped": counts[state.value] > COUNT_LIMIT or (
                    self.paginator.partial and counts[state.value] > 0),
                "selected": selected == state.value,
                "url": self.get_query_string({"state__exact": state.value}, [PAGE_VAR]),
            }
            for state in State
        ]

    def summary_total(self) -> int:
        return sum(min(n, COUNT_LIMIT) for n in self.paginator.state_counts.values())

    def summary_capped(self) -> bool:
        return self.paginator.partial or any(
            n > COUNT_LIMIT for n in self.paginator.state_counts.values())
