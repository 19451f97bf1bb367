"""A fake payment provider that honours an ``Idempotency-Key`` header, the way Stripe does.

A real HTTP server (werkzeug's threaded server on 127.0.0.1), so worker processes reach it
as they would a real API:

- ``POST /v1/charges`` with a JSON body (``amount``, ``currency``, ``reference``): a new
  key creates a charge (201); the same key with the same body returns the stored charge
  again (200, header ``Idempotent-Replayed: true``) and creates nothing; the same key with
  a different body is refused (422). Without the header every request is a new charge.
- ``GET /v1/charges``: every charge (``{"count": n, "data": [...]}``).
- ``GET /v1/charges/<id>``: one charge.

Start it in a test with :func:`serve` (a free port unless one is given) or from a shell
with ``python -m django_app.fakes.provider --port 8765``.
"""

from __future__ import annotations

import argparse
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from werkzeug.exceptions import HTTPException, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.serving import BaseWSGIServer, make_server
from werkzeug.wrappers import Request, Response

from .client import KEY_HEADER

REPLAYED_HEADER = "Idempotent-Replayed"
FIELDS = ("amount", "currency", "reference")


def _json(payload: Any, status: int = 200, **headers: str) -> Response:
    return Response(json.dumps(payload), status=status, headers=headers,
                    mimetype="application/json")


@dataclass
class Provider:
    """The provider's state and its WSGI application; safe to call from many threads."""

    charges: list[dict[str, Any]] = field(default_factory=list)
    #: every POST seen: (idempotency key or None, the answer's status)
    requests: list[tuple[str | None, int]] = field(default_factory=list)
    _by_key: dict[str, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict,
                                                                    repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    urls = Map([
        Rule("/v1/charges", methods=["POST"], endpoint="create"),
        Rule("/v1/charges", methods=["GET"], endpoint="list"),
        Rule("/v1/charges/<charge_id>", methods=["GET"], endpoint="detail"),
    ])

    def charge(self, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, Any]]:
        """Create a charge, or answer a repeated key: (HTTP status, JSON payload)."""
        if not isinstance(body, dict) or set(body) != set(FIELDS) \
                or not isinstance(body["amount"], int) or body["amount"] <= 0:
            return 400, {"error": "invalid_request", "fields": list(FIELDS)}
        # One lock over look-up and insert: two concurrent requests with one key must not
        # both create a charge (Stripe answers the second with 409; storing first is simpler).
        with self._lock:
            if key is not None and key in self._by_key:
                stored_body, charge = self._by_key[key]
                status = 200 if stored_body == body else 422
                answer = charge if status == 200 else {
                    "error": "idempotency_key_reused",
                    "message": "this key was used with a different request body"}
            else:
                status = 201
                answer = {"id": f"ch_{len(self.charges) + 1:06d}", **body,
                          "idempotency_key": key, "status": "succeeded"}
                self.charges.append(answer)
                if key is not None:
                    self._by_key[key] = (dict(body), answer)
            self.requests.append((key, status))
            return status, answer

    def count(self, reference: str | None = None) -> int:
        with self._lock:
            return sum(1 for c in self.charges if reference in (None, c["reference"]))

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        try:
            endpoint, values = self.urls.bind_to_environ(environ).match()
            response = getattr(self, f"_on_{endpoint}")(request, **values)
        except HTTPException as exc:
            response = _json({"error": exc.name}, exc.code or 500)
        return response(environ, start_response)

    def _on_create(self, request: Request) -> Response:
        try:
            body = json.loads(request.get_data(as_text=True))
        except ValueError:
            return _json({"error": "invalid_json"}, 400)
        status, answer = self.charge(body, request.headers.get(KEY_HEADER))
        replayed = {REPLAYED_HEADER: "true"} if status == 200 else {}
        return _json(answer, status, **replayed)

    def _on_list(self, request: Request) -> Response:
        with self._lock:
            data = list(self.charges)
        return _json({"count": len(data), "data": data})

    def _on_detail(self, request: Request, charge_id: str) -> Response:
        with self._lock:
            found = [c for c in self.charges if c["id"] == charge_id]
        if not found:
            raise NotFound()
        return _json(found[0])


class RunningProvider:
    """A :class:`Provider` served on a thread; ``url`` is its base URL."""

    def __init__(self, server: BaseWSGIServer, provider: Provider) -> None:
        self.server = server
        self.provider = provider
        self.url = f"http://{server.host}:{server.port}"
        self._thread = threading.Thread(target=server.serve_forever, name="fake-provider",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> RunningProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(port: int = 0, host: str = "127.0.0.1") -> RunningProvider:
    """Start a fresh provider on ``host:port`` (0: a free port) and return it running."""
    provider = Provider()
    return RunningProvider(make_server(host, port, provider, threaded=True), provider)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    running = serve(args.port, args.host)
    print(f"fake provider on {running.url}", flush=True)
    try:
        running._thread.join()
    except KeyboardInterrupt:
        running.stop()


if __name__ == "__main__":
    main()
