"""The payment provider's client, as the shop would have it (a real one would be e.g.
Stripe's library). It speaks to any provider that honours the ``Idempotency-Key``
header; the demo serves the fake one in ``django_app/fakes/provider.py``."""

import json
import urllib.request


def create_charge(base_url, *, amount, currency, reference, idempotency_key, timeout=10.0):
    """POST a charge; the provider answers a repeated key with the charge it made first.

    A network failure raises ``OSError`` (``urllib.error.URLError``): retry it with the
    same key. An error status raises ``urllib.error.HTTPError``.
    """
    request = urllib.request.Request(
        f"{base_url}/v1/charges", method="POST",
        data=json.dumps({"amount": amount, "currency": currency,
                         "reference": reference}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": idempotency_key})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())
