"""The schema celery-idem's migrations make, as JSON: one snapshot per database vendor in
tests/db/schema/ (``postgresql.json``, ``mysql.json``, ``sqlite.json``), which
tests/db/test_schema.py compares with what the migrations make on a fresh database.

What is recorded, for the tables named ``celery_idem_*``:

- every database: Django's introspection (columns, and every index and constraint with
  its columns, kind and order);
- PostgreSQL: each column's type, nullability, default and identity
  (information_schema), each index's definition (``pg_indexes``: method, columns,
  operator classes, the condition of a partial one), each constraint's definition
  (``pg_get_constraintdef``), the tables' storage parameters (the fillfactor), and the
  source of every function named ``celery_idem_*`` (the stored routines);
- MariaDB/MySQL: each column's type, character set, collation, nullability, default and
  extra (information_schema), the indexes (their columns, order, prefix, uniqueness,
  method), the check and foreign key constraints, each table's engine, collation and
  options, and ``SHOW CREATE TABLE`` (its lines sorted: MySQL lists indexes in creation
  order, which is no part of the schema);
- SQLite: the ``CREATE`` statements in ``sqlite_master``.

When a migration changes the schema on purpose, rewrite the snapshots from a fresh
database of each vendor (the servers of tests/tiers.py; ``IDEM_DATABASE`` picks one, as
for the tests), and commit them with the migration::

    .venv/bin/python -m tests.db.schema_snapshot --write          # SQLite
    IDEM_DATABASE=postgres .venv/bin/python -m tests.db.schema_snapshot --write
    IDEM_DATABASE=mysql .venv/bin/python -m tests.db.schema_snapshot --write

and read the snapshots' diff before committing it: it should show what the migration
meant to change and nothing else.

Without ``--write`` it prints the differences from the committed snapshot and exits 1 if
there are any. (``--here`` prints the schema of the configured database itself, as JSON:
the fresh database's subprocess runs that.)
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = Path(__file__).resolve().parent / "schema"
PREFIX = "celery_idem_"


def snapshot_path(vendor: str) -> Path:
    return SNAPSHOTS / f"{vendor}.json"


# -- what the configured database holds -----------------------------------------------------


def _rows(cursor: Any, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> list[list[Any]]:
    cursor.execute(sql, params)
    return [list(row) for row in cursor.fetchall()]


def _introspected(connection: Any, cursor: Any, table: str) -> dict[str, Any]:
    """What Django's introspection says of ``table``."""
    introspection = connection.introspection
    columns = [[c.name, c.type_code if isinstance(c.type_code, str | int) else str(c.type_code),
                c.null_ok, c.default]
               for c in introspection.get_table_description(cursor, table)]
    constraints = {
        name: {key: (list(value) if isinstance(value, list | tuple) else value)
               for key, value in sorted(info.items())}
        for name, info in sorted(introspection.get_constraints(cursor, table).items())}
    return {"columns": columns, "constraints": constraints}


def _postgresql(cursor: Any, tables: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for table in tables:
        found[table] = {
            "columns": _rows(cursor, """
                SELECT column_name, data_type, character_maximum_length, numeric_precision,
                       is_nullable, column_default, is_identity, identity_generation,
                       collation_name
                FROM information_schema.columns
                WHERE table_schema = current_schema() AND table_name = %s
                ORDER BY ordinal_position""", [table]),
            "indexes": _rows(cursor, """
                SELECT indexname, indexdef FROM pg_indexes
                WHERE schemaname = current_schema() AND tablename = %s
                ORDER BY indexname""", [table]),
            "constraints": _rows(cursor, """
                SELECT c.conname, c.contype, pg_get_constraintdef(c.oid), c.condeferrable,
                       c.condeferred
                FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
                WHERE t.relname = %s AND t.relnamespace = current_schema()::regnamespace
                ORDER BY c.conname""", [table]),
            "options": _rows(cursor, """
                SELECT relkind, relpersistence, coalesce(reloptions, '{}') FROM pg_class
                WHERE relname = %s AND relnamespace = current_schema()::regnamespace""",
                             [table]),
        }
    functions = _rows(cursor, """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
        FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE %s
        ORDER BY 1, 2""", [PREFIX + "%"])
    return {"tables": found, "functions": functions}


def _mysql(cursor: Any, tables: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for table in tables:
        where = "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s"
        cursor.execute(f"SHOW CREATE TABLE `{table}`")
        create = re.sub(r" AUTO_INCREMENT=\d+", "", cursor.fetchone()[1])
        found[table] = {
            "columns": _rows(cursor, f"""
                SELECT COLUMN_NAME, COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME,
                       IS_NULLABLE, COLUMN_DEFAULT, EXTRA, GENERATION_EXPRESSION
                FROM information_schema.COLUMNS WHERE {where}
                ORDER BY ORDINAL_POSITION""", [table]),
            "indexes": _rows(cursor, f"""
                SELECT INDEX_NAME, SEQ_IN_INDEX, COLUMN_NAME, COLLATION, SUB_PART,
                       NON_UNIQUE, INDEX_TYPE
                FROM information_schema.STATISTICS WHERE {where}
                ORDER BY INDEX_NAME, SEQ_IN_INDEX""", [table]),
            "constraints": _rows(cursor, f"""
                SELECT CONSTRAINT_NAME, CONSTRAINT_TYPE
                FROM information_schema.TABLE_CONSTRAINTS WHERE {where}
                ORDER BY CONSTRAINT_NAME""", [table]),
            "checks": _rows(cursor, """
                SELECT CONSTRAINT_NAME, CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS
                WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = %s
                ORDER BY CONSTRAINT_NAME""", [table]),
            "foreign_keys": _rows(cursor, """
                SELECT CONSTRAINT_NAME, REFERENCED_TABLE_NAME, UPDATE_RULE, DELETE_RULE
                FROM information_schema.REFERENTIAL_CONSTRAINTS
                WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = %s
                ORDER BY CONSTRAINT_NAME""", [table]),
            "options": _rows(cursor, f"""
                SELECT ENGINE, ROW_FORMAT, TABLE_COLLATION, CREATE_OPTIONS
                FROM information_schema.TABLES WHERE {where}""", [table]),
            "create": sorted(line.strip().rstrip(",") for line in create.splitlines()),
        }
    routines = _rows(cursor, """
        SELECT ROUTINE_NAME, ROUTINE_TYPE, ROUTINE_DEFINITION FROM information_schema.ROUTINES
        WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME LIKE %s ORDER BY 1""",
                     [PREFIX + "%"])
    triggers = _rows(cursor, """
        SELECT TRIGGER_NAME, ACTION_STATEMENT FROM information_schema.TRIGGERS
        WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE LIKE %s ORDER BY 1""",
                     [PREFIX + "%"])
    return {"tables": found, "routines": routines, "triggers": triggers}


def _sqlite(cursor: Any, tables: list[str]) -> dict[str, Any]:
    return {"objects": _rows(cursor, """
        SELECT type, name, tbl_name, sql FROM sqlite_master
        WHERE tbl_name LIKE %s ESCAPE '\\' ORDER BY type, name""", ["celery\\_idem\\_%"])}


def current_schema() -> dict[str, Any]:
    """The celery-idem schema of the configured database (``django.setup()`` done)."""
    from django.db import connection

    with connection.cursor() as cursor:
        tables = sorted(t for t in connection.introspection.table_names(cursor)
                        if t.startswith(PREFIX))
        vendor = {"postgresql": _postgresql, "mysql": _mysql, "sqlite": _sqlite}
        return {"vendor": connection.vendor,
                "introspection": {t: _introspected(connection, cursor, t) for t in tables},
                connection.vendor: vendor[connection.vendor](cursor, tables)}


# -- a fresh database, migrated ----------------------------------------------------------


def _manage(database: str, *argv: str) -> str:
    """``django-admin`` on the test project, against ``database``."""
    env = {**os.environ, "IDEM_DB_NAME": database,
           "DJANGO_SETTINGS_MODULE": "django_app.settings"}
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def migrate(database: str, *target: str) -> None:
    """``migrate`` in a process of its own (the migration loader's state stays there)."""
    _manage(database, "-m", "django", "migrate", "--no-input", "celery_idem", *target)


def schema_of(database: str) -> dict[str, Any]:
    """``current_schema()`` of ``database``, read by a process of its own."""
    output: dict[str, Any] = json.loads(_manage(database, "-m", "tests.db.schema_snapshot",
                                                "--here"))
    return output


@contextmanager
def fresh_database() -> Iterator[str]:
    """An empty database of the configured vendor (its name, or its file on SQLite),
    dropped afterwards."""
    from django.db import connection

    if connection.vendor == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield str(Path(folder) / "schema.sqlite3")
        return
    name = f"idem_schema_{uuid.uuid4().hex[:8]}"
    create = ("CREATE DATABASE {} CHARACTER SET utf8mb4" if connection.vendor == "mysql"
              else "CREATE DATABASE {}")
    # Django's own way to a server whose configured database may not exist yet.
    with connection._nodb_cursor() as cursor:
        cursor.execute(create.format(name))
    try:
        yield name
    finally:
        with connection._nodb_cursor() as cursor:
            cursor.execute(f"DROP DATABASE {name}")


def migrated_schema() -> dict[str, Any]:
    """The schema every migration makes on a fresh database of the configured vendor."""
    with fresh_database() as database:
        migrate(database)
        return schema_of(database)


def difference(expected: dict[str, Any], found: dict[str, Any]) -> str:
    """A unified diff of two schemas' JSON, empty when they are the same."""
    return "".join(difflib.unified_diff(
        dump(expected).splitlines(keepends=True), dump(found).splitlines(keepends=True),
        "snapshot", "migrated"))


def dump(schema: dict[str, Any]) -> str:
    """JSON a line per column, index, constraint or routine (a diff names the one that
    changed); ``str()`` of what JSON has no type for (a driver's type code)."""
    return _dump(json.loads(json.dumps(schema, default=str)), "") + "\n"


def _dump(value: Any, indent: str) -> str:
    inner = indent + " "
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {_dump(v, inner)}" for k, v in sorted(value.items())]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list) and value:  # a row a line
        return "[\n" + ",\n".join(inner + json.dumps(v) for v in value) + f"\n{indent}]"
    return json.dumps(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.db.schema_snapshot",
                                     description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true",
                        help="rewrite the configured vendor's snapshot from a fresh database")
    action.add_argument("--here", action="store_true",
                        help="print the configured database's schema as JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_app.settings")
    import django

    django.setup()
    if args.here:
        sys.stdout.write(dump(current_schema()))
        return 0
    found = json.loads(dump(migrated_schema()))  # as it reads back from the file
    path = snapshot_path(found["vendor"])
    if args.write:
        path.parent.mkdir(exist_ok=True)
        path.write_text(dump(found))
        print(f"wrote {path.relative_to(ROOT)}")
        return 0
    diff = difference(json.loads(path.read_text()), found)
    sys.stdout.write(diff or f"{path.relative_to(ROOT)}: the same\n")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
