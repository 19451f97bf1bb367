"""Which jobs a recovery pass looks at: the queryset conditions of its sweeps
(``recovery.sweep``), each the range of one index, and the re-dispatch back-off they
wait by. ``idem_status`` counts the lost messages with the same condition."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q

from ..conf import settings
from ..states import State, never_sent_q

#: Re-dispatch waits stop doubling after this many steps (2**30 x the timeout is forever).
_MAX_DOUBLINGS = 30


def redispatch_wait(dispatch_count: int) -> float:
    """Seconds a PENDING job waits for a claim, after its message was due, before it is
    sent again: the dispatch timeout, doubled per re-dispatch so far, capped."""
    timeout = float(settings.DISPATCH_TIMEOUT)
    cap = max(float(settings.DISPATCH_MAX_BACKOFF), timeout)
    return float(min(timeout * 2 ** min(dispatch_count, _MAX_DOUBLINGS), cap))


def lost_messages(now: datetime) -> Q:
    """PENDING jobs whose message was due ``redispatch_wait(dispatch_count)`` ago and was
    not claimed (``sent_and_lost``), or never sent (``never_sent``), and not expired."""
    return (sent_and_lost(now) | never_sent(now)) & ~Q(expires_at__lt=now)


def sent_and_lost(now: datetime) -> Q:
    """Sent, and not claimed within its wait. A message is due at the later of the last
    write and the not-before of a scheduled retry, so a retry's own message gets the full
    timeout after its ETA. Every level waited at least the dispatch timeout since the
    last write: that bound, said once more, is the range the PENDING index reads (the
    levels alone would read every PENDING job)."""
    levels = Q()
    for count in range(_MAX_DOUBLINGS + 1):
        wait = redispatch_wait(count)
        last = wait >= redispatch_wait(_MAX_DOUBLINGS) or count == _MAX_DOUBLINGS
        due_before = now - timedelta(seconds=wait)
        waited = Q(updated_at__lt=due_before) & (
            Q(not_before__isnull=True) | Q(not_before__lt=due_before))
        levels |= (Q(dispatch_count__gte=count) if last else Q(dispatch_count=count)) & waited
        if last:
            break
    soonest = now - timedelta(seconds=redispatch_wait(0))
    return Q(state=State.PENDING, updated_at__lt=soonest) & levels & ~never_sent_q()


def never_sent(now: datetime) -> Q:
    """Written in a transaction, not marked sent, never claimed (a claim can beat the
    mark; the message then certainly left), past CELERY_IDEM_NEVER_SENT_TIMEOUT."""
    return Q(state=State.PENDING) & never_sent_q() & Q(
        created_at__lt=now - timedelta(seconds=float(settings.NEVER_SENT_TIMEOUT)))


def expired(now: datetime) -> Q:
    """PENDING jobs whose message expired before any worker claimed it."""
    return Q(state=State.PENDING, expires_at__lt=now)
