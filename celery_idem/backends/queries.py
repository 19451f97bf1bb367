"""The named queries of the SQL backends (``load_queries``, ``render_guard``: MySQL's
``mysql.sql`` too) and the PostgreSQL backend's statements: those of ``postgresql.sql``, with
the parts a move decides (its guard, the columns it sets, whether it records) filled in
from the move table (``celery_idem.states``). Rendered once per move and cached: the same
text each time, so it is prepared once per session where prepared statements are asked
for (``backends.prepared``)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from .. import states
from ..models import Checkpoint, Job, Transition
from ..states import Guard, Move
from .values import DUPLICATE, JSON_COLUMNS, ORDERED_JSON_COLUMNS, ROW_COLUMNS

#: What ``move_result_final`` raises when its move matched nothing.
DIVISION_BY_ZERO = "22012"


def load_queries(path: Path, row: str = ", ".join(ROW_COLUMNS)) -> dict[str, str]:
    """The ``-- name: X`` blocks of ``path``, by name, with the table names and ``row``
    (the select list of a JobRow) filled in."""
    queries: dict[str, str] = {}
    name = None
    for line in path.read_text().splitlines():
        match = re.match(r"--\s*name:\s*(\w+)", line)
        if match:
            name = match.group(1)
            queries[name] = ""
        elif name is not None and not line.startswith("--"):
            queries[name] += line + "\n"
    tables = {"job": Job._meta.db_table, "history": Transition._meta.db_table,
              "checkpoint": Checkpoint._meta.db_table, "row": row}
    history_insert = queries.get("history_insert", "").strip().format(**tables)
    return {name: text.strip().replace("{history_insert}", history_insert)
            .replace("{job}", tables["job"]).replace("{history}", tables["history"])
            .replace("{row}", tables["row"]).replace("{checkpoint}", tables["checkpoint"])
            for name, text in queries.items()}


#: PostgreSQL reads a ``json`` column as its text, as it reads ``jsonb`` (``fields``).
QUERIES = load_queries(Path(__file__).with_name("postgresql.sql"), ", ".join(
    f"{c}::text AS {c}" if c in ORDERED_JSON_COLUMNS else c for c in ROW_COLUMNS))


def render_guard(guard: Guard, queries: dict[str, str]) -> str:
    """A move's guard flags as SQL, from the guard_* fragments of ``queries``; ``true``
    for none."""
    parts = [queries[f"guard_{flag.name.lower()}"] for flag in Guard
             if flag and flag.name and flag in guard]
    return " AND ".join(parts) or "true"


def _guard(guard: Guard) -> str:
    return render_guard(guard, QUERIES)


def _sets(columns: tuple[str, ...], source: str = "%(v_{c})s") -> str:
    return "".join(f", {c} = {source.format(c=c)}" + (_json_cast(c) if "%" in source else "")
                   for c in columns)


def _json_cast(column: str) -> str:
    if column not in JSON_COLUMNS:
        return ""
    return "::json" if column in ORDERED_JSON_COLUMNS else "::jsonb"


#: The history values of a line a worker writes (no actor).
_WORKER_LINE = "%(worker)s, %(task_id)s, %(reason)s, ''"


def _record(move: Move, history_values: str, source: str = "moved",
            start: str | None = None) -> str:
    """The history CTE of ``move`` if it records; ``start``: the expression of the start
    of the attempt it ends, over ``source``, for a statement that can end one."""
    if not move.recorded:
        return ""
    if not move.records_start:
        start = "NULL"
    elif start is None:
        raise ValueError(f"the statement of move {move.event!r} cannot keep its start")
    return "\n" + (QUERIES["move_record"].replace("{history_values}", history_values)
                   .replace("{source}", source).replace("{start}", start))


def _start_returning(move: Move) -> str:
    """What a move's UPDATE returns besides the row's id and attempt: its start, which
    the history CTE of a move that ends an attempt keeps."""
    return QUERIES["start_returning"] if move.records_start else ""


@cache
def insert_sql(event: str) -> str:
    """The insert of move ``event``: an intent, or a claim whose intent is missing."""
    return QUERIES["insert"].replace("{record}", _record(states.move(event), _WORKER_LINE,
                                                         "ins"))


@cache
def commit_new_sql(event: str) -> str:
    """The insert of move ``event``'s finished row (``committed``)."""
    if states.move(event).recorded:
        raise ValueError(f"the statement of move {event!r} writes no history line")
    return QUERIES["commit_new"]


@cache
def insert_batch_sql(event: str) -> str:
    """The insert of many intents (move ``event``) in one statement."""
    return QUERIES["insert_batch"].replace(
        "{record}", _record(states.move(event), "'', task_id, '', ''", "ins"))


@cache
def claim_sql(event: str) -> str:
    """The claim statement of move ``event``."""
    m, duplicate = states.move(event), states.move(DUPLICATE)
    guard = _guard(m.guard)
    if m.records_start:  # a take-over: the start it keeps is the attempt's it guards
        guard += " AND " + QUERIES["claim_start_guard"]
    sql = (QUERIES["claim"].replace("{guard}", guard)
           .replace("{start_read}", QUERIES["claim_start_read"] if m.records_start else "")
           .replace("{record}", _record(m, _WORKER_LINE, "claimed", QUERIES["claim_start"])))
    if not duplicate.recorded:
        return sql.replace("{duplicate}", "").replace("{duplicate_recorded}", "false")
    return (sql.replace("{duplicate}", "\n" + QUERIES["claim_duplicate"])
            .replace("{duplicate_guard}", _guard(duplicate.guard))
            .replace("{duplicate_recorded}", "EXISTS (SELECT 1 FROM dup)"))


@cache
def move_sql(event: str, columns: tuple[str, ...], final: bool = False) -> str:
    """The statement of move ``event`` setting ``columns``; ``final``: it ends its
    transaction, and fails when the row does not match (``move_result_final``)."""
    m = states.move(event)
    if m.target is None and not columns:
        return QUERIES["record"].replace("{guard}", _guard(m.guard))
    return (QUERIES["move"].replace("{guard}", _guard(m.guard)).replace("{sets}", _sets(columns))
            .replace("{start_returning}", _start_returning(m))
            .replace("{record}", _record(m, "%(worker)s, %(task_id)s, %(reason)s, %(actor)s",
                                         start="started_at"))
            .replace("{result}", QUERIES["move_result_final" if final else "move_result"]))


@cache
def step_sql(event: str) -> str:
    m = states.move(event)
    return (QUERIES["step_save"].replace("{guard}", _guard(m.guard))
            .replace("{record}", _record(m, "%(worker)s, %(task_id)s, %(reason)s, %(actor)s")))


@cache
def batch_sql(event: str, columns: tuple[str, ...], types: tuple[str, ...]) -> str:
    m = states.move(event)
    return (QUERIES["move_batch"]
            .replace("{arrays}", "".join(f", %(v_{c})s::{t}[]" for c, t in zip(columns, types,
                                                                                 strict=True)))
            .replace("{names}", "".join(f", v_{c}" for c in columns))
            .replace("{sets}", _sets(columns, "v.v_{c}"))
            .replace("{start_returning}", _start_returning(m))
            .replace("{record}", _record(m, "h_worker, h_task_id, h_reason, ''",
                                         start="started_at")))
