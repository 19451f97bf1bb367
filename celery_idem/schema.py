"""What the migrations do differently per database, in one place.

- PostgreSQL: the job table's fillfactor, so a row's next version stays on its page
  (migration 0006); the task id in a hash index, whose entries are smaller to log than a
  B-tree's (0012).
- MySQL/MariaDB have no partial indexes. Django creates an index with a condition there
  without it; two of those would serve their query badly on their own columns, so they
  become plain indexes led by the state (0006). Their default collations fold case and
  ignore trailing spaces, which would make ``Order-1`` and ``order-1`` one key: the key
  columns compare byte for byte instead (0008).
- A partial index that would cover every row there (the history's dead-letter index) is
  not made on MySQL/MariaDB (``AddPartialIndex``).
- MySQL/MariaDB commit each DDL statement, so a migration that failed half-way leaves
  part of its work behind, and running it again fails on it ("Duplicate key name"). The
  ``*IfMissing`` / ``*IfPresent`` operations skip what is already done there; on
  databases whose DDL is transactional (PostgreSQL, SQLite) they are the plain ones.
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


#: PostgreSQL: these B-tree indexes become hash indexes (0012), (model, column) each. A
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
    """0006 forwards: the fillfactor (PostgreSQL); the plain state indexes (MySQL), made
    whatever a try that failed half-way left."""
    table = apps.get_model("celery_idem", "Job")._meta.db_table
    quote = schema_editor.quote_name
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {quote(table)} SET (fillfactor = {FILLFACTOR})")
    plain_state_indexes(apps, schema_editor)


def plain_state_indexes(apps: Any, schema_editor: Any) -> None:
    """MySQL/MariaDB: PLAIN_INDEXES as they are now, whatever is there (0006, and 0013,
    which changed the pending index's columns); a no-op elsewhere."""
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


def undo_job_table_layout(apps: Any, schema_editor: Any) -> None:
    """0006 backwards: the fillfactor goes; on MySQL, 0006's AddIndex operations drop
    the plain indexes by name as they unapply."""
    if schema_editor.connection.vendor == "postgresql":
        table = apps.get_model("celery_idem", "Job")._meta.db_table
        schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} "
                              "RESET (fillfactor)")


def _rebuild_indexes(apps: Any, schema_editor: Any, method: str) -> None:
    """HASH_INDEXES rebuilt with ``method`` on PostgreSQL, whatever method they have now
    (so running it again rebuilds the same); a no-op elsewhere."""
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    for name, (model_name, field_name) in HASH_INDEXES.items():
        model = apps.get_model("celery_idem", model_name)
        column = model._meta.get_field(field_name).column
        schema_editor.execute(f"DROP INDEX IF EXISTS {quote(name)}")
        schema_editor.execute(f"CREATE INDEX {quote(name)} ON {quote(model._meta.db_table)} "
                              f"USING {method} ({quote(column)})")


def hash_indexes(apps: Any, schema_editor: Any) -> None:
    """0012 forwards: HASH_INDEXES as hash indexes (PostgreSQL)."""
    _rebuild_indexes(apps, schema_editor, "hash")


def btree_indexes(apps: Any, schema_editor: Any) -> None:
    """0012 backwards: HASH_INDEXES as the B-tree indexes Django made (PostgreSQL)."""
    _rebuild_indexes(apps, schema_editor, "btree")


def binary_key_columns(apps: Any, schema_editor: Any) -> None:
    """0008 forwards, MySQL/MariaDB: the identity columns compare byte for byte.
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


# -- operations that can run again where DDL cannot roll back ----------------------------


def _rerun_guarded(schema_editor: Any) -> bool:
    """Whether to look before acting: DDL commits statement by statement here (and the
    statements are run, not only printed by sqlmigrate)."""
    return not schema_editor.connection.features.can_rollback_ddl and not \
        schema_editor.collect_sql


def _has(schema_editor: Any, state: Any, app_label: str, model_name: str, name: str) -> bool:
    table = state.apps.get_model(app_label, model_name)._meta.db_table
    return name in _indexes(schema_editor, table)


class _RerunGuard:
    """Makes an index or constraint operation re-runnable where DDL cannot roll back: it
    skips creating what is already there and dropping what is already gone (a migration
    that failed half-way left it so). ``adds``: the operation creates the object going
    forwards (and drops it going backwards)."""

    adds: bool
    model_name: str

    @property
    def object_name(self) -> str:
        raise NotImplementedError

    def _done(self, schema_editor: Any, app_label: str, state: Any, creating: bool) -> bool:
        """Whether the step is done already: the object there (creating) or gone."""
        return _rerun_guarded(schema_editor) and _has(
            schema_editor, state, app_label, self.model_name, self.object_name) == creating

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        state = to_state if self.adds else from_state
        if not self._done(schema_editor, app_label, state, creating=self.adds):
            super().database_forwards(  # type: ignore[misc]
                app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        state = from_state if self.adds else to_state
        if not self._done(schema_editor, app_label, state, creating=not self.adds):
            super().database_backwards(  # type: ignore[misc]
                app_label, schema_editor, from_state, to_state)


class AddIndexIfMissing(_RerunGuard, migrations.AddIndex):
    """AddIndex; where DDL cannot roll back, an index of that name already there stays."""

    adds = True

    @property
    def object_name(self) -> str:
        return str(self.index.name)


class AddPartialIndex(AddIndexIfMissing):
    """AddIndexIfMissing of a partial index that only helps where it stays partial: not
    made on MySQL/MariaDB, which would index every row (the history's dead-letter index:
    there the lookup per job uses the (job, at) index)."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        if not _is_mysql(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        if not _is_mysql(schema_editor):
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class RemoveIndexIfPresent(_RerunGuard, migrations.RemoveIndex):
    """RemoveIndex; where DDL cannot roll back, an index already gone is not an error."""

    adds = False

    @property
    def object_name(self) -> str:
        return str(self.name)


class AddConstraintIfMissing(_RerunGuard, migrations.AddConstraint):
    """AddConstraint; where DDL cannot roll back, a constraint of that name already there
    stays."""

    adds = True

    @property
    def object_name(self) -> str:
        return str(self.constraint.name)


class RemoveConstraintIfPresent(_RerunGuard, migrations.RemoveConstraint):
    """RemoveConstraint; where DDL cannot roll back, one already gone is not an error."""

    adds = False

    @property
    def object_name(self) -> str:
        return str(self.name)


class AlterForeignKeyIndex(migrations.AlterField):
    """AlterField of a foreign key's ``db_index``. Unapplied on MySQL/MariaDB it creates
    the column's index, which may be there already: removing an index that served the
    foreign key (0006's parent index) makes Django create one of its own first, as
    InnoDB needs one. An index on exactly that column already there is enough."""

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        if _rerun_guarded(schema_editor):
            model = to_state.apps.get_model(app_label, self.model_name)
            column = model._meta.get_field(self.name).column
            if [column] in _indexes(schema_editor, model._meta.db_table).values():
                return
        super().database_backwards(app_label, schema_editor, from_state, to_state)
