"""The statements suite's timed loops (part 2 of bench/suites/statements.py), each ``--iterations`` operations
on one persistent connection (the plugin's claim+commit, the same SQL through psycopg,
the raw floors, whole tasks through the tracer). statements.py's ``timings`` runs them
in rounds; they are apart from it so that what a loop does reads apart from the rounds.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.lib.tracer import QUEUE, run_task


def pending_intents(task: Any, n: int, tag: str) -> list[Any]:
    """n PENDING jobs of ``task`` (published through the producer path) and their intents."""
    intents = []
    for i in range(n):
        key = f"{tag}-{i}"
        task.apply_async((key,), queue=QUEUE)
        intents.append(task.intent((key,)))
    return intents


def loop_plugin(intents: list[Any], dedicated: bool = False) -> float:
    """claims.acquire + Claim.succeed; ``dedicated``: on the worker's own connection."""
    from celery_idem import claims

    extra = {"dedicated": True} if dedicated else {}
    started = time.perf_counter()
    for intent in intents:
        _, claim = claims.acquire(intent, worker="bench/1", task_id=str(uuid.uuid4()),
                                  lease_seconds=3600, using="default", **extra)
        assert claim is not None and claim.succeed(intent.key)
    return time.perf_counter() - started


def capture_statements(intent: Any) -> list[tuple[str, dict[str, Any]]]:
    """The (sql, params) the plugin sends for one claim+commit."""
    from django.db import connection

    from celery_idem import claims

    seen: list[tuple[str, Any]] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append((sql, dict(params) if isinstance(params, dict) else params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        _, claim = claims.acquire(intent, worker="bench/1", task_id="capture",
                                  lease_seconds=3600, using="default")
        assert claim is not None and claim.succeed(intent.key)
    if len(seen) != 2:
        raise RuntimeError(f"expected 2 statements for claim+commit, saw {len(seen)}")
    return seen


def raw_connection() -> Any:
    import psycopg
    from django.db import connection

    s = connection.settings_dict
    return psycopg.connect(dbname=s["NAME"], user=s["USER"], host=s["HOST"], port=s["PORT"],
                           autocommit=True, cursor_factory=psycopg.ClientCursor)


def _claim_params(captured: dict[str, Any], intent: Any, now: datetime) -> dict[str, Any]:
    """The captured claim's parameters, for ``intent`` now (a fresh task id and lease)."""
    params = dict(captured)
    params.update(key=intent.key, fingerprint=intent.fingerprint, task_id=str(uuid.uuid4()),
                  now=now, lease=now + timedelta(hours=1))
    if "args" in params:
        params["args"] = json.dumps(intent.args)
    return params


def loop_raw_same(conn: Any, template: list[tuple[str, dict[str, Any]]],
                  intents: list[Any], prepare: bool = False) -> float:
    """The plugin's two statements through psycopg; ``prepare``: server-side binding and
    named prepared statements (psycopg ``prepare=True``), so PostgreSQL plans them once
    per connection instead of once per execution."""
    import psycopg

    (claim_sql, claim_p), (commit_sql, commit_p) = template
    cursor = psycopg.Cursor(conn) if prepare else psycopg.ClientCursor(conn)
    opts = {"prepare": True} if prepare else {}
    started = time.perf_counter()
    for intent in intents:
        now = datetime.now(UTC)
        p = _claim_params(claim_p, intent, now)
        row = cursor.execute(claim_sql, p, **opts).fetchone()
        assert row[0] is True, row
        job_id, attempt = row[_ID_POS], row[_ATTEMPT_POS]
        q = dict(commit_p)
        q.update(id=job_id, attempt=attempt, now=now, task_id=p["task_id"])
        if "v_finished_at" in q:
            q["v_finished_at"] = now
        if "v_result" in q:
            q["v_result"] = json.dumps(intent.key)
        assert cursor.execute(commit_sql, q, **opts).fetchone()[0] == 1
    return time.perf_counter() - started


def loop_raw_replay(conn: Any, template: list[tuple[str, dict[str, Any]]],
                    intents: list[Any], read_only: bool) -> float:
    """A replay of finished keys: the plugin's claim statement as sent (its ``duplicate``
    history line makes it a write, so its commit waits for a WAL flush), or
    (``read_only``) a plain SELECT of the row, what a replay without that line costs."""
    from celery_idem.backends.values import ROW_COLUMNS

    claim_sql, claim_p = template[0]
    select = f"SELECT {', '.join(ROW_COLUMNS)} FROM celery_idem_job WHERE namespace = %s AND key = %s"
    started = time.perf_counter()
    for intent in intents:
        if read_only:
            row = conn.execute(select, (intent.namespace, intent.key)).fetchone()
            assert row is not None
            continue
        now = datetime.now(UTC)
        p = _claim_params(claim_p, intent, now)
        row = conn.execute(claim_sql, p).fetchone()
        assert row[0] is False, row
    return time.perf_counter() - started


#: Where a claim row holds the job's attempt and id: ``locate_claim_columns`` sets them.
_ATTEMPT_POS = 0
_ID_POS = 0


def locate_claim_columns() -> None:
    """Where a claim row holds the job's id and attempt, for ``loop_raw_same`` (before
    the loops run)."""
    global _ATTEMPT_POS, _ID_POS
    from celery_idem.backends.values import ROW_COLUMNS

    # A claim row is (won, recorded, *ROW_COLUMNS).
    _ATTEMPT_POS = 2 + list(ROW_COLUMNS).index("attempt")
    _ID_POS = 2 + list(ROW_COLUMNS).index("id")
    assert ROW_COLUMNS[0] == "id"


def loop_raw_minimal(conn: Any, intents: list[Any]) -> float:
    started = time.perf_counter()
    for intent in intents:
        row = conn.execute(
            "UPDATE celery_idem_job SET state = 'RUNNING', attempt = attempt + 1,"
            " lease_expires_at = now() + interval '1 hour'"
            " WHERE namespace = %s AND key = %s AND state = 'PENDING' RETURNING id, attempt",
            (intent.namespace, intent.key)).fetchone()
        cur = conn.execute(
            "UPDATE celery_idem_job SET state = 'SUCCEEDED', result = to_jsonb(key),"
            " finished_at = now() WHERE id = %s AND attempt = %s AND state = 'RUNNING'", row)
        assert cur.rowcount == 1
    return time.perf_counter() - started


def loop_raw_insert(conn: Any, n: int, tag: str) -> float:
    started = time.perf_counter()
    for i in range(n):
        conn.execute("INSERT INTO effects_effect (key, pid, created_at) VALUES (%s, %s, now())",
                     (f"{tag}-{i}", os.getpid()))
    return time.perf_counter() - started


def loop_reconnect(n: int) -> float:
    """What Celery 5.6+'s Django fixup costs per task: close, reconnect, one query."""
    from django.db import connection

    started = time.perf_counter()
    for _ in range(n):
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    return time.perf_counter() - started


def loop_select1(n: int) -> float:
    """One round trip on a kept connection, for scale."""
    from django.db import connection

    started = time.perf_counter()
    for _ in range(n):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    return time.perf_counter() - started


def loop_tasks(task: Any, keys: list[str], header_prefix: str | None) -> float:
    started = time.perf_counter()
    for key in keys:
        run_task(task, (key,), key=None if header_prefix is None else header_prefix + key)
    return time.perf_counter() - started


def has_dedicated() -> bool:
    import inspect

    from celery_idem import claims

    return "dedicated" in inspect.signature(claims.acquire).parameters
