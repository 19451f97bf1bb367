"""The fake payment provider over real HTTP: it honours Idempotency-Key as documented,
so the external-key tests that rely on it prove something."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from django_app.fakes.client import ProviderError, create_charge
from django_app.fakes.provider import RunningProvider


@pytest.fixture
def provider(fake_provider: RunningProvider) -> RunningProvider:
    return fake_provider


def charge(provider: RunningProvider, key: str | None, amount: int = 500,
           reference: str = "order-1") -> dict:
    return create_charge(provider.url, amount=amount, currency="eur", reference=reference,
                         idempotency_key=key)


def listing(provider: RunningProvider) -> dict:
    with urllib.request.urlopen(f"{provider.url}/v1/charges", timeout=10) as response:
        return json.loads(response.read())


def test_same_key_returns_the_stored_charge_and_creates_nothing(provider):
    first = charge(provider, "k-1")
    again = charge(provider, "k-1")
    assert again == first and first["id"] == "ch_000001"
    assert listing(provider)["count"] == 1
    assert provider.provider.requests == [("k-1", 201), ("k-1", 200)]


def test_same_key_with_a_different_body_is_refused(provider):
    charge(provider, "k-2", amount=500)
    with pytest.raises(ProviderError) as refused:
        charge(provider, "k-2", amount=501)
    assert refused.value.status == 422
    assert refused.value.payload["error"] == "idempotency_key_reused"
    assert provider.provider.count() == 1


def test_without_a_key_every_request_is_a_new_charge(provider):
    charge(provider, None)
    charge(provider, None)
    assert [c["id"] for c in listing(provider)["data"]] == ["ch_000001", "ch_000002"]


def test_concurrent_requests_with_one_key_create_one_charge(provider):
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: charge(provider, "k-race"), range(16)))
    assert {a["id"] for a in answers} == {"ch_000001"}
    assert provider.provider.count() == 1


def test_detail_and_bad_requests(provider):
    made = charge(provider, "k-3")
    with urllib.request.urlopen(f"{provider.url}/v1/charges/{made['id']}", timeout=10) as r:
        assert json.loads(r.read()) == made
    with pytest.raises(ProviderError) as bad:
        create_charge(provider.url, amount=0, currency="eur", reference="x",
                      idempotency_key="k-4")
    assert bad.value.status == 400
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{provider.url}/v1/charges/ch_999999", timeout=10)
    assert missing.value.code == 404
    missing.value.close()
