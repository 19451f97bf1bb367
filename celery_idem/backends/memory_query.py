"""A Django ``Q`` evaluated against a job in memory: the recovery pass's filters for the
in-memory backend (``backends.memory``), which has no database to send them to."""

from __future__ import annotations

import operator
from typing import Any

from django.db.models import Q


def q_matches(q: Q, job: Any) -> bool:
    """Evaluate a recovery filter (``Q`` of exact, ``__lt``, ``__lte``, ``__gt``,
    ``__gte``, ``__isnull``, ``__in`` lookups) against a job in memory."""
    results = []
    for child in q.children:
        if isinstance(child, Q):
            results.append(q_matches(child, job))
            continue
        lookup, expected = child
        column, _, op = lookup.partition("__")
        value = getattr(job, column)
        results.append(_LOOKUPS[op or "exact"](value, expected))
    matched = all(results) if q.connector == Q.AND else any(results)
    return not matched if q.negated else matched


def _ordered(compare: Any) -> Any:
    return lambda value, expected: value is not None and compare(value, expected)


_LOOKUPS = {"exact": operator.eq, "lt": _ordered(operator.lt), "lte": _ordered(operator.le),
            "gt": _ordered(operator.gt), "gte": _ordered(operator.ge),
            "isnull": lambda value, expected: (value is None) == expected,
            "in": lambda value, expected: value in expected}
