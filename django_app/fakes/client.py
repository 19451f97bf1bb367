"""A client for the fake payment provider, standard library only (worker processes import
it without the server's dependencies)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

KEY_HEADER = "Idempotency-Key"


class ProviderError(Exception):
    """The provider answered with an error status; ``status`` and ``payload`` say which."""

    def __init__(self, status: int, payload: Any) -> None:
        super().__init__(f"provider answered {status}: {payload}")
        self.status = status
        self.payload = payload


def create_charge(base_url: str, *, amount: int, currency: str, reference: str,
                  idempotency_key: str | None, timeout: float = 10.0) -> dict[str, Any]:
    """POST a charge and return it (the stored one when the key was seen before).

    Raises ProviderError on a 4xx/5xx answer; a network failure raises ``OSError``
    (``urllib.error.URLError``), which is worth retrying with the same key.
    """
    body = json.dumps({"amount": amount, "currency": currency, "reference": reference})
    headers = {"Content-Type": "application/json"}
    if idempotency_key is not None:
        headers[KEY_HEADER] = idempotency_key
    request = urllib.request.Request(f"{base_url}/v1/charges", data=body.encode(),
                                     headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:  # the error is the response too: close its socket
            payload = json.loads(exc.read() or b"null")
        raise ProviderError(exc.code, payload) from None
