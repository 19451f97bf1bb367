"""Leases on the tier's database: acquire, renew, release and the fencing check, through
the PostgreSQL SQL and the portable ORM path (both on PostgreSQL, the portable one on
SQLite), with a clock the tests move."""

from __future__ import annotations

import multiprocessing
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.db import connection, transaction
from django.utils import timezone

from celery_idem import leases
from celery_idem.errors import IdempotencyError, InvalidLease, LeaseLost
from celery_idem.models import Lease
from tests.integration.workers import wait_until

from .lease_contender import acquire_once
from .lock_waits import POLL_SECONDS, ROW_LOCKING, lock_waiters

KINDS = ["native", "portable"] if settings.DATABASE_KIND == "postgres" else ["portable"]


@pytest.fixture(params=KINDS)
def sql(request, monkeypatch):
    """Which implementation acquire and check use: PostgreSQL's SQL or the ORM path."""
    chosen = leases.POSTGRES if request.param == "native" else leases.PORTABLE
    monkeypatch.setattr(leases, "_sql", lambda using: chosen)
    return chosen


class Clock:
    def __init__(self) -> None:
        self.now = timezone.now().replace(microsecond=0)

    def __call__(self):
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(timezone, "now", clock)
    return clock


pytestmark = pytest.mark.django_db


def test_first_acquisition_creates_the_lease_with_token_one(sql, clock):
    lease = leases.acquire("tenant/1", "a", 10)
    assert (lease.name, lease.holder, lease.token) == ("tenant/1", "a", 1)
    assert lease.expires_at == clock.now + timedelta(seconds=10)
    assert lease.acquired_at == lease.renewed_at == clock.now
    stored = Lease.objects.get(name="tenant/1")
    assert (stored.holder, stored.token, stored.expires_at) == ("a", 1, lease.expires_at)


def test_another_holder_gets_none_while_the_lease_is_live(sql, clock):
    first = leases.acquire("tenant/1", "a", 10)
    clock.advance(9.9)
    assert leases.acquire("tenant/1", "b", 10) is None
    stored = Lease.objects.get(name="tenant/1")
    assert (stored.holder, stored.token, stored.expires_at) == ("a", 1, first.expires_at)


def test_the_holder_acquiring_its_live_lease_renews_it_and_keeps_the_token(sql, clock):
    first = leases.acquire("tenant/1", "a", 10)
    clock.advance(5)
    again = leases.acquire("tenant/1", "a", 10)
    assert again.token == 1
    assert again.acquired_at == first.acquired_at
    assert again.renewed_at == clock.now
    assert again.expires_at == clock.now + timedelta(seconds=10)


def test_an_expired_lease_is_taken_over_with_a_greater_token(sql, clock):
    leases.acquire("tenant/1", "a", 10)
    clock.advance(10)  # expires_at == now: expired
    taken = leases.acquire("tenant/1", "b", 10)
    assert (taken.holder, taken.token, taken.acquired_at) == ("b", 2, clock.now)
    assert Lease.objects.count() == 1


def test_tokens_only_grow_whoever_acquires(sql, clock):
    """Alternating holders, takeovers, releases and re-acquisitions of an expired lease:
    every new holding has a greater token than all before it."""
    tokens = []
    for n in range(12):
        holder = "ab"[n % 3 == 0]  # the same holder sometimes comes back after expiry
        lease = leases.acquire("shard", holder, 5)
        assert lease is not None
        tokens.append(lease.token)
        if n % 2:
            assert leases.release(lease)
        else:
            clock.advance(5)
    assert tokens == list(range(1, 13))
    assert Lease.objects.get(name="shard").token == 12


def test_renew_extends_a_live_lease_by_its_own_length(sql, clock):
    lease = leases.acquire("tenant/1", "a", 10)
    clock.advance(8)
    renewed = leases.renew(lease)
    assert renewed.expires_at == clock.now + timedelta(seconds=10)
    assert Lease.objects.get(name="tenant/1").expires_at == renewed.expires_at
    clock.advance(1)
    assert leases.renew(lease, 30).expires_at == clock.now + timedelta(seconds=30)
    assert Lease.objects.get(name="tenant/1").token == 1


def test_renew_of_an_expired_or_taken_lease_raises_lease_lost(sql, clock):
    lease = leases.acquire("tenant/1", "a", 10)
    clock.advance(10)
    with pytest.raises(LeaseLost):
        leases.renew(lease)
    leases.acquire("tenant/1", "b", 10)
    stale = Lease.objects.get(name="tenant/1")
    stale.token, stale.holder = 1, "a"
    with pytest.raises(LeaseLost, match="expired or was taken"):
        leases.renew(stale)
    assert Lease.objects.get(name="tenant/1").holder == "b"


def test_release_frees_the_lease_at_once_for_the_next_holder(sql, clock):
    lease = leases.acquire("tenant/1", "a", 60)
    assert leases.release(lease) is True
    assert leases.release(lease) is False  # no longer live: nothing to release
    taken = leases.acquire("tenant/1", "b", 60)
    assert (taken.holder, taken.token) == ("b", 2)
    assert leases.release(lease) is False  # an old holding cannot release the new one
    assert Lease.objects.get(name="tenant/1").expires_at == taken.expires_at


def test_check_passes_the_newest_token_and_refuses_an_older_one(sql, clock):
    old = leases.acquire("tenant/1", "a", 10)
    leases.check("tenant/1", old.token)
    clock.advance(20)
    leases.check("tenant/1", old.token)  # expired, but nobody holds a newer token
    new = leases.acquire("tenant/1", "b", 10)
    with transaction.atomic():
        leases.check("tenant/1", new.token)
        with pytest.raises(LeaseLost, match="fenced out") as caught:
            leases.check("tenant/1", old.token)
    assert caught.value.details == {"name": "tenant/1", "token": 1, "current": 2}
    with pytest.raises(LeaseLost, match="no lease named"):
        leases.check("tenant/unknown", 1)


@pytest.mark.parametrize("call", [
    lambda: leases.acquire("", "a", 10),
    lambda: leases.acquire("   ", "a", 10),
    lambda: leases.acquire(None, "a", 10),
    lambda: leases.acquire("x" * 256, "a", 10),
    lambda: leases.acquire("n", "", 10),
    lambda: leases.acquire("n", "a", 0),
    lambda: leases.acquire("n", "a", -1),
    lambda: leases.acquire("n", "a", float("nan")),
    lambda: leases.acquire("n", "a", True),
    lambda: leases.acquire("n", "a", "10"),
    lambda: leases.check("n", "1"),
    lambda: leases.check("", 1),
])
def test_bad_input_is_refused_with_invalid_lease(call):
    with pytest.raises(InvalidLease) as caught:
        call()
    assert isinstance(caught.value, IdempotencyError) and isinstance(caught.value, ValueError)
    assert not Lease.objects.exists()


def test_a_skip_is_counted_on_the_lease_row(clock):
    leases.acquire("tenant/1", "a", 10)
    leases.record_skip("tenant/1")
    clock.advance(1)
    leases.record_skip("tenant/1")
    stored = Lease.objects.get(name="tenant/1")
    assert (stored.skipped_ticks, stored.last_skipped_at) == (2, clock.now)


@pytest.mark.skipif(connection.vendor not in ROW_LOCKING,
                    reason="SQLite has one writer at a time: there is no row lock to observe")
@pytest.mark.django_db(transaction=True)
def test_a_takeover_waits_for_the_transaction_that_checked_the_old_token(sql, clock):
    """The check locks the lease row until the write's transaction ends, so the newer
    token is granted (in another process) only after the old holder's checked write has
    committed."""
    old = leases.acquire("tenant/1", "a", 10)
    clock.advance(10)
    env = {"IDEM_DB_NAME": str(connection.settings_dict["NAME"]),
           "IDEM_DATABASE": settings.DATABASE_KIND,
           "DJANGO_SETTINGS_MODULE": "django_app.settings"}
    kind = "native" if sql is leases.POSTGRES else "portable"
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    contender = ctx.Process(target=acquire_once,
                            args=(env, kind, clock.now.isoformat(), results))
    try:
        with transaction.atomic():
            leases.check("tenant/1", old.token)
            contender.start()

            def waiting_on_the_lock() -> bool:
                return lock_waiters() == 1 or not results.empty()
            wait_until(waiting_on_the_lock, 60, POLL_SECONDS,
                       "the takeover to wait for the lock")
            assert results.empty(), "the takeover did not wait for the checked write"
        assert results.get(timeout=60) == 2
    finally:
        contender.join(timeout=60)
        if contender.is_alive():
            contender.kill()
    assert Lease.objects.get(name="tenant/1").holder == "b"


class TestAdmin:
    LIST = "/admin/celery_idem/lease/"

    @pytest.fixture
    def viewer(self, client, django_user_model):
        user = django_user_model.objects.create_user("viewer", is_staff=True)
        user.user_permissions.add(Permission.objects.get(codename="view_lease"))
        client.force_login(user)
        return client

    def test_lists_name_holder_token_expiry_and_whether_live(self, viewer):
        now = timezone.now()
        Lease.objects.create(name="tenant/1", holder="w1@h/11", token=7,
                             expires_at=now + timedelta(minutes=5))
        Lease.objects.create(name="tenant/2", holder="w2@h/22", token=3,
                             expires_at=now - timedelta(minutes=5), skipped_ticks=4)
        html = viewer.get(self.LIST).content.decode()
        first = html[html.index(">tenant/1<"):]
        first, second = first[:first.index("</tr>")], html[html.index(">tenant/2<"):]
        second = second[:second.index("</tr>")]
        assert "w1@h/11" in first and ">7<" in first and ">live<" in first and "(in 4 min)" in first
        assert "w2@h/22" in second and ">3<" in second and ">expired<" in second
        assert "(expired 5 min ago)" in second and ">4<" in second

    def test_is_read_only(self, viewer, admin_client):
        lease = Lease.objects.create(name="tenant/1", holder="w", token=1,
                                     expires_at=timezone.now())
        page = viewer.get(f"{self.LIST}{lease.pk}/change/")
        assert page.status_code == 200 and "tenant/1" in page.content.decode()
        assert admin_client.get(f"{self.LIST}add/").status_code == 403
        assert admin_client.post(f"{self.LIST}{lease.pk}/delete/").status_code == 403
        admin_client.post(f"{self.LIST}{lease.pk}/change/", {"holder": "x", "token": 9})
        assert Lease.objects.get(pk=lease.pk).token == 1
