"""Which jobs a recovery pass looks at: its sweeps (``recovery.sweep``), each the range
of one index read in that index's order, and the re-dispatch back-off they wait by.
``idem_status`` counts the lost messages with the same conditions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q

from ..conf import settings
from ..states import State, never_sent_q

#: Re-dispatch waits stop doubling after this many steps (2**30 x the timeout is forever).
_MAX_DOUBLINGS = 30


@dataclass(frozen=True)
class Sweep:
    """A condition, and the columns of the index whose range it is, ending with the id.

    A pass reads the rows in that order, a batch at a time, each batch after the last
    row of the one before (``after``). In id order instead, PostgreSQL may walk the
    primary key expecting matches soon: with none there it read the whole table (4 s a
    pass at 10M jobs), because it cannot know that few PENDING jobs are due."""

    condition: Q
    order: tuple[str, ...]

    def after(self, row: Any) -> Q:
        """The rows past ``row`` in ``order`` (a keyset: a row skipped stays behind)."""
        values = [getattr(row, column) for column in self.order]
        past = Q(**{f"{self.order[0]}__gt": values[0]})
        for n in range(1, len(self.order)):
            past |= Q(**dict(zip(self.order[:n], values[:n], strict=True)),
                      **{f"{self.order[n]}__gt": values[n]})
        return past


def redispatch_wait(dispatch_count: int) -> float:
    """Seconds a PENDING job waits for a claim, after its message was due, before it is
    sent again: the dispatch timeout, doubled per re-dispatch so far, capped."""
    timeout = float(settings.DISPATCH_TIMEOUT)
    cap = max(float(settings.DISPATCH_MAX_BACKOFF), timeout)
    return float(min(timeout * 2 ** min(dispatch_count, _MAX_DOUBLINGS), cap))


def lost_messages(now: datetime) -> list[Sweep]:
    """PENDING jobs whose message was due ``redispatch_wait(dispatch_count)`` ago and was
    not claimed (``sent_and_lost``), or never sent (``never_sent``), and not expired: as
    disjoint sweeps, each the range of one index (their union in one query reads every
    PENDING job), so a pass sweeps them one by one and idem_status adds them up."""
    not_expired = ~Q(expires_at__lt=now)
    return [Sweep(level & not_expired, ("updated_at", "id")) for level in sent_and_lost(now)
            ] + [Sweep(never_sent(now) & not_expired, ("created_at", "id"))]


def sent_and_lost(now: datetime) -> list[Q]:
    """Sent, and not claimed within its wait: one condition per re-dispatch count (the
    last for every count from where the wait stops doubling), each a range of the
    pending index, (dispatch_count, updated_at). A message is due at the later of the
    last write and the not-before of a scheduled retry, so a retry's own message gets
    the full timeout after its ETA. The jobs waiting between re-sends are in none of the
    ranges: a pass and idem_status do not read them (100,000 after an outage)."""
    levels = []
    for count in range(_MAX_DOUBLINGS + 1):
        wait = redispatch_wait(count)
        last = wait >= redispatch_wait(_MAX_DOUBLINGS) or count == _MAX_DOUBLINGS
        due_before = now - timedelta(seconds=wait)
        sent = Q(dispatch_count__gte=count) if last else Q(dispatch_count=count)
        levels.append(Q(state=State.PENDING) & sent & Q(updated_at__lt=due_before) & (
            Q(not_before__isnull=True) | Q(not_before__lt=due_before)) & ~never_sent_q())
        if last:
            return levels
    return levels


def never_sent(now: datetime) -> Q:
    """Written in a transaction, not marked sent, never claimed (a claim can beat the
    mark; the message then certainly left), past CELERY_IDEM_NEVER_SENT_TIMEOUT."""
    return Q(state=State.PENDING) & never_sent_q() & Q(
        created_at__lt=now - timedelta(seconds=float(settings.NEVER_SENT_TIMEOUT)))


def expired(now: datetime) -> Q:
    """PENDING jobs whose message expired before any worker claimed it."""
    return Q(state=State.PENDING, expires_at__lt=now)
