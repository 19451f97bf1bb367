"""The migrations make exactly the committed schema of the tier's database
(tests/db/schema/<vendor>.json: tables, columns and their types, indexes with their
methods and conditions, constraints, PostgreSQL's stored routines, MariaDB's collations),
and unapply without leaving any of it. A migration that changes the schema on purpose
rewrites the snapshot: ``python -m tests.db.schema_snapshot --write`` (its docstring)."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from tests.db.schema_snapshot import (
    difference,
    dump,
    fresh_database,
    migrate,
    schema_of,
    snapshot_path,
)

pytestmark = pytest.mark.django_db

REWRITE = "python -m tests.db.schema_snapshot --write (tests/db/schema_snapshot.py)"


def committed() -> dict:
    return json.loads(snapshot_path(connection.vendor).read_text())


def read(database: str) -> dict:
    return json.loads(dump(schema_of(database)))  # as it reads back from a snapshot


def test_a_fresh_database_migrates_to_the_committed_schema_and_back_to_nothing():
    with fresh_database() as database:
        migrate(database)
        diff = difference(committed(), read(database))
        assert not diff, f"the migrations' schema is not the snapshot ({REWRITE}):\n{diff}"

        migrate(database, "zero")
        left = read(database)
        assert left["introspection"] == {}, "tables left behind"
        assert not left.get("postgresql", {}).get("functions"), "routines left behind"

        migrate(database)
        assert not difference(committed(), read(database)), "not the same the second time"
