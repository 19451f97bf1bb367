"""The hot path's statements as PL/pgSQL functions: planned once per server session,
with nothing left on the session.

Without prepared statements (the default since issue 18, so that a transaction pooler
can hand the session to anyone) PostgreSQL parses and plans every statement it is sent,
and the library's CTEs cost more to plan than to run: an intent, a claim and a commit
took 2,780 µs of the server's CPU sent as statements, 1,300 as routines and 1,180
prepared (docs/decisions/2026-11-26-stored-routines.md). A PL/pgSQL function keeps the plans of the
statements in its body in the server process's own cache, which belongs to no client:
any session may run the function, a pooler may move the client between sessions, and
nothing breaks when the plan is not there yet (it is made again). So the statements a
fresh task runs are installed as functions by a migration, and the backend sends a call
(``SELECT * FROM celery_idem_claim_<hash>(...)``) in place of the statement.

- **One text.** A routine's body is the statement ``queries`` renders from the move table,
  with each ``%(name)s`` placeholder a typed parameter: nothing is written twice, and the
  name ends with a hash of the body, so code and database cannot silently disagree.
- **Frozen in migrations**, as Django freezes schema: ``python -m
  celery_idem.backends.routines`` prints the routines for a new migration when a rendered
  statement changes (tests/unit/test_routines.py fails until one installs them). A
  migration that replaces a routine leaves the old one in place, for workers of the
  previous release still calling it.
- **One round trip, no pipeline.** A routine's first parameter, ``unflushed``, sets its
  own transaction's ``synchronous_commit`` off (the bookkeeping connection's claims and
  commits), as ``pipeline`` does before a statement: nothing stays on the session.
- **Optional at run time.** The backend calls a routine only where its database has it
  (one catalog read per database and process, ``calls``); elsewhere, before the migration
  or on another backend, it sends the statement itself.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from functools import cache
from typing import Any

from .. import states
from .pipeline import UNFLUSHED_COMMIT
from .values import COMMITTED, ROW_COLUMNS

PREFIX = "celery_idem_"
#: A routine's first parameter, ``unflushed``: its commit does not wait for the WAL flush
#: (the bookkeeping connection's claims and commits), set for its own transaction as
#: ``pipeline`` sets it before a statement, so a call needs no pipeline.
_UNFLUSHED = UNFLUSHED_COMMIT.replace("SELECT", "PERFORM", 1)
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")

#: SQL types of the placeholders that are not text. Integers are bigint, which psycopg's
#: int2/int4/int8 parameters all convert to implicitly (an integer parameter would not
#: take an int8).
_PARAM_TYPES = {"unflushed": "boolean", "attempt": "bigint", "parent": "bigint",
                "id": "bigint", "dispatch_count": "bigint",
                **dict.fromkeys(["now", "lease", "started_at", "not_before", "expires_at",
                                 "sent_at"], "timestamptz")}
#: Django field types as function parameter and result types (no length: a varchar of
#: any length passes).
_FIELD_TYPES = {"BigAutoField": "bigint", "PositiveIntegerField": "integer",
                "CharField": "varchar", "JSONField": "jsonb", "DateTimeField": "timestamptz"}


def _column_type(column: str) -> str:
    from ..fields import OrderedJSONField
    from ..models import Job  # imported on use: ``python -m`` runs this before django.setup

    field = Job._meta.get_field(column)
    if isinstance(field, OrderedJSONField):
        return "text"  # read as the text it keeps (``{row}`` casts it), written as text
    return _FIELD_TYPES[field.get_internal_type()]


def _param_type(name: str) -> str:
    column = name.removeprefix("v_")
    if name != column:  # a value the move sets: JSON arrives as text, cast in the body
        found = _column_type(column)
        return "text" if found == "jsonb" else found
    return _PARAM_TYPES.get(name, "text")


@dataclass(frozen=True)
class Routine:
    """``statement`` (as ``queries`` renders it) as a function returning ``returns``."""

    label: str
    statement: str
    returns: str

    @property
    def params(self) -> tuple[str, ...]:
        return ("unflushed", *dict.fromkeys(_PLACEHOLDER.findall(self.statement)))

    @property
    def body(self) -> str:
        return _PLACEHOLDER.sub(lambda m: f"p_{m.group(1)}", self.statement)

    @property
    def signature(self) -> str:
        return ", ".join(f"p_{p} {_param_type(p)}" for p in self.params)

    @property
    def name(self) -> str:
        """The label and a hash of everything but the name: another text, another name."""
        text = f"{self.signature}\n{self.returns}\n{self.body}"
        return f"{PREFIX}{self.label}_{hashlib.sha256(text.encode()).hexdigest()[:10]}"

    @property
    def create(self) -> str:
        # The result columns share names with the table's: in the body, a name is the
        # column's.
        return (f"CREATE OR REPLACE FUNCTION {self.name}({self.signature})\n"
                f"RETURNS TABLE ({self.returns}) LANGUAGE plpgsql AS $body$\n"
                f"#variable_conflict use_column\nBEGIN\n"
                f"IF p_unflushed THEN\n    {_UNFLUSHED};\nEND IF;\n"
                f"RETURN QUERY\n{self.body};\nEND\n$body$")

    @property
    def call(self) -> str:
        args = ", ".join(f"%({p})s" for p in self.params)
        return f"SELECT * FROM {self.name}({args})"


def _ends(event: str) -> tuple[str, ...]:
    """The columns an ending move sets, as the backend's ``move_sql`` is asked for them."""
    return tuple(sorted(states.move(event).sets))


@cache
def hot() -> tuple[Routine, ...]:
    """The statements of a fresh task and a replay: the intent, the claim (also as a
    first write where the intent is missing, as with ``DURABILITY = "broker"``), and the
    commits, on the bookkeeping connection and as an atomic body's last statement (an
    optimistic one's: the finished row's insert)."""
    from .queries import claim_sql, commit_new_sql, insert_sql, move_sql

    row = ", ".join(f"{c} {_column_type(c)}" for c in ROW_COLUMNS)
    outcome = f"won boolean, recorded boolean, {row}"
    routines = (
        Routine("insert", insert_sql("published"), outcome),
        Routine("insert", insert_sql("claimed"), outcome),
        Routine("claim", claim_sql("claimed"), outcome),
        Routine("succeed", move_sql("succeeded", _ends("succeeded")), "attempt integer"),
        Routine("succeed_final", move_sql("succeeded", _ends("succeeded"), final=True),
                "checked integer"),
        Routine("fail", move_sql("failed", _ends("failed")), "attempt integer"),
        Routine("commit", commit_new_sql(COMMITTED), "id bigint"),
    )
    unique: dict[str, Routine] = {}
    for routine in routines:  # the intent and a first claim are one statement today
        unique.setdefault(routine.statement, routine)
    return tuple(unique.values())


#: Per database (NAME, HOST, PORT): rendered statement -> the call of its routine.
_installed: dict[tuple[Any, ...], dict[str, str]] = {}


def calls(connection: Any) -> dict[str, str]:
    """The routines installed in ``connection``'s database (a Django DatabaseWrapper),
    as statement -> call; read from the catalog once per database and process."""
    settings = connection.settings_dict
    where = (settings["NAME"], settings["HOST"], settings["PORT"])
    found = _installed.get(where)
    if found is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT proname FROM pg_proc WHERE proname LIKE %s "
                           "AND pg_function_is_visible(oid)", [PREFIX.replace("_", r"\_") + "%"])
            names = {name for (name,) in cursor.fetchall()}
        found = {r.statement: r.call for r in hot() if r.name in names}
        _installed[where] = found
    return found


def call_or(connection: Any, sql: str, params: dict[str, Any], unflushed: bool = False) -> str:
    """The call of ``sql``'s routine where ``connection``'s database has one, its own
    parameter added to ``params``; else ``sql`` itself."""
    call = calls(connection).get(sql)
    if call is None:
        return sql
    params["unflushed"] = unflushed
    return call


def statement_of(sql: str) -> str:
    """The statement a call in a query log stands for (``sql`` itself if it is not a
    call of a routine): what logs and tests read."""
    if PREFIX in sql:
        for routine in hot():
            if routine.name in sql:
                return routine.statement
    return sql


def forget() -> None:
    """Read the catalog again on next use (the migrations that install routines call it)."""
    _installed.clear()


def migration_source() -> str:
    """The ``ROUTINES`` of a migration installing ``hot()``, as Python source."""
    lines = ["ROUTINES = {"]
    for routine in hot():
        lines.append(f"    {routine.name!r}: (")
        lines.extend(f"        {line!r}" for line in routine.create.splitlines(keepends=True))
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - a developer's tool
    import django

    django.setup()
    sys.stdout.write(migration_source() + "\n")
