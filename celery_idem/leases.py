"""Named leases with fencing tokens on the job database: one holder per name at a time.

``acquire`` gives a holder the lease (or ``None`` while another holder's lease is live),
``renew`` extends it, ``release`` gives it up, and ``check`` is the fencing check a write
makes inside its own transaction before it lands: it raises ``LeaseLost`` once a newer
token exists, so a holder that was paused past its lease (a GC pause, a stalled VM) cannot
overwrite the work of the holder that replaced it (Kleppmann, "How to do distributed
locking"). The token grows on every acquisition and never goes back.

Every operation is one conditional statement. The only database-specific SQL is in
``PostgresLeases`` (an upsert with RETURNING, and SELECT ... FOR SHARE); ``PortableLeases``
does the same through the ORM on every database Django supports. Time is the caller's
``django.utils.timezone.now()``: workers whose clocks disagree by more than a small part
of the lease can overlap, and only the fencing check protects the writes then.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, models, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from .conf import settings
from .errors import InvalidLease, LeaseLost
from .lease_model import HOLDER_MAX_LENGTH, NAME_MAX_LENGTH, Lease

__all__ = ["Lease", "acquire", "check", "record_skip", "release", "renew"]


def _text(what: str, value: Any, max_length: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidLease(f"a lease {what} must be a non-empty str, not {value!r}")
    if len(value) > max_length:
        raise InvalidLease(f"a lease {what} is {len(value)} characters; the most is {max_length}")
    return value


def _seconds(seconds: Any) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
            or not math.isfinite(seconds) or seconds <= 0:
        raise InvalidLease(f"a lease lasts a finite number of seconds > 0, not {seconds!r}")
    return float(seconds)


def _alias(using: str | None) -> str:
    return using or settings.DATABASE


class PortableLeases:
    """The ORM path: SQLite, MariaDB/MySQL, PostgreSQL and any other Django database."""

    def acquire(self, using: str, name: str, holder: str, now: datetime,
                expires: datetime) -> Lease | None:
        own_live = Q(holder=holder, expires_at__gt=now)
        leases = Lease.objects.using(using)
        with transaction.atomic(using=using):
            # Take the row if it expired or is ours. MySQL/MariaDB assign SET columns left
            # to right, each seeing those before it: token and acquired_at read the old
            # holder and expiry, so they come first (update() keeps the keyword order).
            updated = leases.filter(Q(name=name) & (Q(expires_at__lte=now) | Q(holder=holder))) \
                .update(
                    token=Case(When(own_live, then=F("token")), default=F("token") + 1),
                    acquired_at=Case(When(own_live, then=F("acquired_at")),
                                     default=Value(now, output_field=models.DateTimeField())),
                    holder=holder, expires_at=expires, renewed_at=now,
                )
            if updated:
                return leases.get(name=name)
            try:
                with transaction.atomic(using=using):
                    return leases.create(name=name, holder=holder, token=1, expires_at=expires,
                                         acquired_at=now, renewed_at=now)
            except IntegrityError:
                # The row exists and is live for another holder, or one just inserted it.
                return None

    def current_token(self, using: str, name: str) -> int | None:
        query = Lease.objects.using(using).filter(name=name)
        if connections[using].in_atomic_block:
            # The row lock makes a concurrent acquisition wait for the caller's commit, so
            # the write this check guards lands before any newer token exists.
            query = query.select_for_update()
        tokens = list(query.values_list("token", flat=True)[:1])
        return tokens[0] if tokens else None


class PostgresLeases(PortableLeases):
    """PostgreSQL: acquisition is one upsert; the fencing check takes a share lock."""

    def _table(self) -> str:
        return Lease._meta.db_table

    def acquire(self, using: str, name: str, holder: str, now: datetime,
                expires: datetime) -> Lease | None:
        columns = [f.column for f in Lease._meta.concrete_fields]
        own_live = "l.holder = EXCLUDED.holder AND l.expires_at > EXCLUDED.acquired_at"
        sql = f"""
            INSERT INTO {self._table()} AS l
                (name, holder, token, expires_at, acquired_at, renewed_at, skipped_ticks)
            VALUES (%(name)s, %(holder)s, 1, %(expires)s, %(now)s, %(now)s, 0)
            ON CONFLICT (name) DO UPDATE SET
                token = CASE WHEN {own_live} THEN l.token ELSE l.token + 1 END,
                acquired_at = CASE WHEN {own_live} THEN l.acquired_at
                                   ELSE EXCLUDED.acquired_at END,
                holder = EXCLUDED.holder,
                expires_at = EXCLUDED.expires_at,
                renewed_at = EXCLUDED.renewed_at
            WHERE l.expires_at <= EXCLUDED.acquired_at OR l.holder = EXCLUDED.holder
            RETURNING {", ".join(f"l.{c}" for c in columns)}
        """
        with connections[using].cursor() as cursor:
            cursor.execute(sql, {"name": name, "holder": holder, "now": now, "expires": expires})
            row = cursor.fetchone()
        if row is None:
            return None
        return Lease.from_db(using, [f.attname for f in Lease._meta.concrete_fields], row)

    def current_token(self, using: str, name: str) -> int | None:
        # FOR SHARE: concurrent checks do not block each other; an acquisition (an UPDATE
        # of this row) waits until the caller's transaction ends.
        with connections[using].cursor() as cursor:
            cursor.execute(f"SELECT token FROM {self._table()} WHERE name = %s FOR SHARE",
                           [name])
            row = cursor.fetchone()
        return row[0] if row else None


PORTABLE = PortableLeases()
POSTGRES = PostgresLeases()


def _sql(using: str) -> PortableLeases:
    return POSTGRES if connections[using].vendor == "postgresql" else PORTABLE


def acquire(name: str, holder: str, seconds: float, using: str | None = None) -> Lease | None:
    """Give ``holder`` the lease ``name`` for ``seconds``; None while another holds it live.

    A new holding gets a token greater than any before it. The same holder acquiring its
    own live lease renews it and keeps its token.
    """
    name, holder = _text("name", name, NAME_MAX_LENGTH), _text("holder", holder,
                                                                 HOLDER_MAX_LENGTH)
    length = _seconds(seconds)
    using = _alias(using)
    now = timezone.now()
    return _sql(using).acquire(using, name, holder, now, now + timedelta(seconds=length))


def renew(lease: Lease, seconds: float | None = None, using: str | None = None) -> Lease:
    """Extend a live lease by ``seconds`` from now (default: the length it was last given).

    Raises LeaseLost if it expired, was released or another holder took it.
    """
    length = _seconds(seconds if seconds is not None
                      else (lease.expires_at - lease.renewed_at).total_seconds())
    now = timezone.now()
    expires = now + timedelta(seconds=length)
    updated = Lease.objects.using(_alias(using)).filter(
        name=lease.name, holder=lease.holder, token=lease.token, expires_at__gt=now,
    ).update(expires_at=expires, renewed_at=now)
    if not updated:
        raise LeaseLost(f"lease {lease.name!r} (token {lease.token}) expired or was taken",
                        name=lease.name, token=lease.token)
    lease.expires_at, lease.renewed_at = expires, now
    return lease


def release(lease: Lease, using: str | None = None) -> bool:
    """Give up a live lease at once so another holder can take it; False if it was lost."""
    now = timezone.now()
    released = Lease.objects.using(_alias(using)).filter(
        name=lease.name, holder=lease.holder, token=lease.token, expires_at__gt=now,
    ).update(expires_at=now)
    if released:
        lease.expires_at = now
    return bool(released)


def check(name: str, token: int, using: str | None = None) -> None:
    """The fencing check: raise LeaseLost unless ``token`` is the newest of lease ``name``.

    Call it inside the transaction of the write it guards (on the same database): the
    lease row stays locked until that transaction ends, so no newer holder is granted the
    lease between this check and the write's commit. An expired lease that nobody took
    over still passes: no newer holder exists to be overwritten.
    """
    name = _text("name", name, NAME_MAX_LENGTH)
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidLease(f"a fencing token is an int, not {token!r}")
    using = _alias(using)
    current = _sql(using).current_token(using, name)
    if current is None:
        raise LeaseLost(f"no lease named {name!r} exists", name=name, token=token)
    if current != token:
        raise LeaseLost(f"lease {name!r} has token {current}; token {token} is fenced out",
                        name=name, token=token, current=current)


def record_skip(name: str, using: str | None = None) -> None:
    """Count a coordinator tick that met another holder's live lease (shown in the admin)."""
    Lease.objects.using(_alias(using)).filter(name=name).update(
        skipped_ticks=F("skipped_ticks") + 1, last_skipped_at=timezone.now())
