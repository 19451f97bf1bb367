"""What the migrations do differently per database, in one place.

- PostgreSQL: the job table's fillfactor, so a row's next version stays on its page;
  the task id in a hash index, whose entries are smaller to log than a B-tree's.
- MySQL/MariaDB have no partial indexes. Django creates an index with a condition there
  without it; two of those would serve their query badly on their own columns, so they
  become plain indexes led by the state. Their default collations fold case and ignore
  trailing spaces, which would make ``Order-1`` and ``order-1`` one key: the key columns
  compare byte for byte instead.
- A partial index that only helps while it stays partial is not made on MySQL/MariaDB
  (``AddPartialIndex``).

(MySQL/MariaDB also commit each DDL statement: a later migration there that fails
half-way leaves part of its work behind, and running it again must skip what is done.)
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

#: Room left on each page of the job table: a row's next version fits beside it, so the
#: update logs only the changed part of the row, not the row (its envelope) again. None
#: of the moves is a HOT update: each sets ``updated_at``, which the pending index names,
#: and a heartbeat the lease too (docs/decisions/2026-11-25-no-hot-cold-split.md). Takes effect
#: for pages written from now on (``VACUUM FULL celery_idem_job`` rewrites the existing
#: ones, under a lock).
FILLFACTOR = 70

#: Where there are no partial indexes: the partial index of that name becomes this plain
#: one, state first, so the reaper's range (state = RUNNING and lease_expires_at < now;
#: state = PENDING and updated_at < cutoff) reads only its state's rows, not every
#: finished job. Each write that changes the state or the timestamp updates them, where
#: PostgreSQL's partial ones skip finished rows. (The attention index, (state,
#: created_at), and the parent index, (parent_id), serve as Django creates them.)
PLAIN_INDEXES = {
    "celery_idem_job_lease_idx": ("state", "lease_expires_at"),
    "celery_idem_job_pending_idx": ("state", "dispatch_count", "updated_at"),
}

#: Columns whose values are identities compared for equality: (model, field). The state
#: too, so its check constraint refuses "running" as the PostgreSQL one does.
BINARY_COLUMNS = (("job", "namespace"), ("job", "key"), ("job", "state"), ("lease", "name"),
                  ("checkpoint", "step"))

#: Byte-for-byte collations, best first: no pad (a trailing space counts: MariaDB 10.2+,
#: MySQL 8.0.17+), then utf8mb4_bin, which ignores trailing spaces in comparisons.
BINARY_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin", "utf8mb4_bin")


#: PostgreSQL: these B-tree indexes become hash indexes, (model, column) each. A
#: claim or a commit is not a HOT update (it changes the state, which the partial indexes
#: name), so it adds an entry to every index; a hash entry holds a 4-byte hash code where
#: a B-tree's holds the whole 36-character task id: 73-76 WAL bytes an entry instead of
#: 114-122 (docs/decisions/2026-11-25-no-hot-cold-split.md). The only query on the column, the
#: admin's search by task id, is an equality, which is all a hash index answers.
HASH_INDEXES = {"celery_idem_job_task_id_idx": ("job", "task_id")}


def _is_mysql(schema_editor: Any) -> bool:
    return bool(schema_editor.connection.vendor == "mysql")


def _indexes(schema_editor: Any, table: str) -> dict[str, list[str]]:
    """Index and constraint names on ``table`` with their columns."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    return {name: list(info["columns"]) for name, info in found.items()}


def lay_out_job_table(apps: Any, schema_editor: Any) -> None:
    """The fillfactor (PostgreSQL); the plain state indexes (MySQL/MariaDB)."""
    table = apps.get_model("celery_idem", "Job")._meta.db_table
    quote = schema_editor.quote_name
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {quote(table)} SET (fillfactor = {FILLFACTOR})")
    plain_state_indexes(apps, schema_editor)


def plain_state_indexes(apps: Any, schema_editor: Any) -> None:
    """MySQL/MariaDB: PLAIN_INDEXES in place of the indexes of those names Django made
    (without their condition), whatever is there; a no-op elsewhere."""
    table = apps.get_model("celery_idem", "Job")._meta.db_table
    quote = schema_editor.quote_name
    if _is_mysql(schema_editor):
        existing = _indexes(schema_editor, table)
        for name, columns in PLAIN_INDEXES.items():
            if existing.get(name) == list(columns):
                continue
            if name in existing:
                schema_editor.execute(f"DROP INDEX {quote(name)} ON {quote(table)}")
            schema_editor.execute(f"CREATE INDEX {quote(name)} ON {quote(table)} "
                                  f"({', '.join(quote(c) for c in columns)})")


def hash_indexes(apps: Any, schema_editor: Any) -> None:
    """HASH_INDEXES as hash indexes on PostgreSQL (Django made them B-trees); a no-op
    elsewhere."""
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    for name, (model_name, field_name) in HASH_INDEXES.items():
        model = apps.get_model("celery_idem", model_name)
        column = model._meta.get_field(field_name).column
        schema_editor.execute(f"DROP INDEX IF EXISTS {quote(name)}")
        schema_editor.execute(f"CREATE INDEX {quote(name)} ON {quote(model._meta.db_table)} "
                              f"USING hash ({quote(column)})")


def binary_key_columns(apps: Any, schema_editor: Any) -> None:
    """MySQL/MariaDB: the identity columns compare byte for byte; a no-op elsewhere.
    Re-running it sets the same collation again."""
    if not _is_mysql(schema_editor):
        return
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT COLLATION_NAME FROM information_schema.COLLATIONS "
                       "WHERE COLLATION_NAME IN (%s, %s, %s)", BINARY_COLLATIONS)
        available = {row[0] for row in cursor.fetchall()}
    collation = next(c for c in BINARY_COLLATIONS if c in available)
    quote = schema_editor.quote_name
    for model_name, field_name in BINARY_COLUMNS:
        model = apps.get_model("celery_idem", model_name)
        field = model._meta.get_field(field_name)
        null = "NULL" if field.null else "NOT NULL"
        schema_editor.execute(
            f"ALTER TABLE {quote(model._meta.db_table)} MODIFY {quote(field.column)} "
            f"{field.db_type(connection)} CHARACTER SET utf8mb4 COLLATE {collation} {null}")


class AddPartialIndex(migrations.AddIndex):
    """AddIndex of a partial index that only helps where it stays partial: not made on
    MySQL/MariaDB, which would index every row (the expiry, unsent and dead-lettered
    indexes: there the state-led indexes serve their queries)."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        if not _is_mysql(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        if not _is_mysql(schema_editor):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
