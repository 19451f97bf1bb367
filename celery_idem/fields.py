"""``OrderedJSONField``: a JSONField whose value comes back as it was written.

PostgreSQL's ``jsonb`` reorders an object's keys (shortest first, then by bytes), so a
result stored there and replayed to a duplicate's caller would not be the JSON the first
caller got. This field is PostgreSQL's ``json`` type there, which keeps the text as
written; elsewhere it is Django's JSONField as is (MariaDB and SQLite keep the text too).
The library's own statements write it as ``json`` and read it as text (``backends.queries``);
the ORM does the same, never through ``jsonb``.
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

    def select_format(self, compiler: Any, sql: str, params: Any) -> Any:
        # Selected as its text: psycopg would parse a json column itself (Django gives it
        # jsonb as text only), and a JSON string stored there ('"12"') would come back
        # as the text 12 that the field's own parse then reads as a number.
        sql, params = super().select_format(compiler, sql, params)
        if compiler.connection.vendor == "postgresql":
            return f"({sql})::text", params
        return sql, params
