"""``OrderedJSONField``: a JSONField whose value comes back as it was written.

PostgreSQL's ``jsonb`` reorders an object's keys (shortest first, then by bytes), so a
result stored there and replayed to a duplicate's caller would not be the JSON the first
caller got. This field is PostgreSQL's ``json`` type there, which keeps the text as
written; elsewhere it is Django's JSONField as is (MariaDB and SQLite keep the text too).
The library's own statements write it as ``json`` text (``backends.queries``); through the
ORM a value goes as ``json`` too, never through ``jsonb``.
"""

from __future__ import annotations

from typing import Any

from django.db import models


class OrderedJSONField(models.JSONField):
    """A JSONField that keeps an object's key order on every database."""

    def db_type(self, connection: Any) -> str | None:
        if connection.vendor == "postgresql":
            return "json"
        return super().db_type(connection)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        adapted = super().get_db_prep_value(value, connection, prepared)
        if connection.vendor == "postgresql" and type(adapted).__name__ == "Jsonb":
            # Django adapts JSON for jsonb (psycopg's Jsonb): sent as json instead, so the
            # server never parses it into jsonb's order.
            from psycopg.types.json import Json

            return Json(adapted.obj, adapted.dumps)
        return adapted

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        # psycopg parses a json column itself (Django registers a text loader for jsonb
        # only): the value is already Python, in the stored order.
        if value is not None and not isinstance(value, str | bytes):
            return value
        return super().from_db_value(value, expression, connection)
