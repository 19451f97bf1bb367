"""The counts suite (``python -m bench run counts``) counts what it says, on the tier's
database: its counters (bench/lib/counting.py) read a known sequence of statements
right, and each path of the library costs the statements, round trips, commits, flushes
(and on PostgreSQL index entries and updates) pinned here, so a change to any of them is
seen and said."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from bench.lib import counting
from bench.suites import counts
from django_app.effects.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

#: Per path: statements, round trips, commits, flushes on PostgreSQL (direct or behind
#: PgBouncer), MariaDB and SQLite. Round trips are None on SQLite (in process); flushes
#: are PostgreSQL's (the library decides them there: claims and commits on the
#: bookkeeping connection do not wait for the flush), elsewhere every commit flushes
#: as the server is set up to.
PINNED = {
    "postgresql": {
        "publish, plain": (0, 0, 0, 0),
        "publish": (1, 1, 1, 1),
        "publish in atomic(), plain (on commit)": (3, 3, 1, 1),
        # The intent with its savepoint; the sent mark on the bookkeeping connection,
        # unflushed (its setting pipelined with it).
        "publish in atomic() (outbox)": (8, 5, 2, 1),
        "publish, durability broker": (0, 0, 0, 0),
        "publish of a finished key": (1, 1, 0, 0),
        "task, plain": (1, 1, 1, 1),
        "task": (3, 3, 3, 1),
        "task, atomic=True": (5, 4, 1, 1),  # COMMIT with the commit
        "task, durability broker": (3, 3, 3, 1),
        # BEGIN, the body's write, the finished row's insert, COMMIT.
        "task, optimistic, durability broker": (4, 4, 1, 1),
        "task, duplicate of a finished key": (1, 1, 0, 0),
    },
    "mysql": {
        "publish, plain": (0, 0, 0, None),
        "publish": (1, 1, 1, None),
        "publish in atomic(), plain (on commit)": (4, 4, 1, None),
        "publish in atomic() (outbox)": (10, 10, 2, None),
        "publish, durability broker": (0, 0, 0, None),
        "publish of a finished key": (2, 2, 0, None),
        "task, plain": (1, 1, 1, None),
        "task": (4, 4, 3, None),
        "task, atomic=True": (7, 7, 1, None),
        "task, durability broker": (3, 3, 3, None),
        # autocommit off, the body's write, the finished row's insert, COMMIT, on.
        "task, optimistic, durability broker": (5, 5, 1, None),
        "task, duplicate of a finished key": (2, 2, 0, None),
    },
    "sqlite": {
        "publish, plain": (0, None, 0, None),
        "publish": (1, None, 1, None),
        "publish in atomic(), plain (on commit)": (3, None, 1, None),
        "publish in atomic() (outbox)": (9, None, 2, None),
        "publish, durability broker": (0, None, 0, None),
        "publish of a finished key": (2, None, 0, None),
        "task, plain": (1, None, 1, None),
        "task": (4, None, 3, None),
        "task, atomic=True": (6, None, 1, None),
        "task, durability broker": (3, None, 3, None),
        "task, optimistic, durability broker": (4, None, 1, None),
        "task, duplicate of a finished key": (2, None, 0, None),
    },
}
#: PostgreSQL: index entries written, heap updates, HOT updates per operation.
PINNED_ROWS = {
    "publish": (7, 0, 0),
    "publish in atomic() (outbox)": (18, 1, 0),
    "task, plain": (3, 0, 0),
    "task": (15, 2, 0),
    "task, atomic=True": (15, 2, 0),
    "task, durability broker": (15, 1, 0),
    "task, optimistic, durability broker": (8, 0, 0),
    "task, duplicate of a finished key": (0, 0, 0),
}


@pytest.fixture
def direct():
    """On PostgreSQL, the counters' own connection to the test database, with their
    commit probes installed for the test."""
    if connection.vendor != "postgresql":
        yield None
        return
    conn = counting.direct_connection()
    counting.pg_triggers(conn, install=True)
    try:
        yield conn
    finally:
        counting.pg_triggers(conn, install=False)
        conn.close()


def _indexes_of(model) -> int:
    """How many indexes PostgreSQL keeps on ``model``'s table (Django's own pattern
    index of a varchar key too, which its introspection does not report)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_indexes WHERE tablename = %s",
                       [model._meta.db_table])
        return int(cursor.fetchone()[0])


def test_the_counters_read_a_known_sequence(direct):
    """One autocommitted INSERT, a transaction of two, a read: their statements, round
    trips and commits; on PostgreSQL one heap insert and an entry in each of the table's
    indexes per row, and a commit told not to wait for the flush counted as unflushed."""
    vendor = connection.vendor
    Effect.objects.create(key="warm", pid=1)  # the connection open, outside the count

    one = counting.count(lambda: Effect.objects.create(key="a", pid=1), 1, direct)
    assert (one["statements"], one["round_trips"], one["commits"]) == (
        1, None if vendor == "sqlite" else 1, 1)

    def two() -> None:
        with transaction.atomic():
            Effect.objects.create(key="b", pid=1)
            Effect.objects.create(key="c", pid=1)

    both = counting.count(two, 1, direct)
    # BEGIN and COMMIT; MariaDB's autocommit off and on again around them instead of BEGIN
    control = {"postgresql": 2, "sqlite": 2, "mysql": 3}[vendor]
    assert (both["statements"], both["transaction_control"], both["commits"]) == (
        2 + control, control, 1)
    read = counting.count(lambda: list(Effect.objects.filter(key="a")), 1, direct)
    assert (read["statements"], read["commits"], read["flushes"]) == (1, 0, 0)

    if vendor == "mysql":
        assert one["flushes"] == both["flushes"] == (1 if _innodb_flushes() else 0)
    elif vendor == "sqlite":
        assert one["flushes"] == both["flushes"] == 0  # WAL, synchronous NORMAL
    else:
        assert one["flushes"] == both["flushes"] == 1
        assert (one["heap_inserts"], one["index_entries"]) == (1, _indexes_of(Effect))
        assert (both["heap_inserts"], both["index_entries"]) == (2, 2 * _indexes_of(Effect))

        def unflushed() -> None:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT set_config('synchronous_commit', 'off', true)")
                Effect.objects.create(key="d", pid=1)

        quick = counting.count(unflushed, 1, direct)
        assert (quick["commits"], quick["flushes"]) == (1, 0)


def _innodb_flushes() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@innodb_flush_log_at_trx_commit")
        return int(cursor.fetchone()[0]) == 1


@pytest.fixture
def paths(monkeypatch):
    """The suite's paths on the test project's app; nothing leaves for a broker (the
    messages a publish hands it are run in this process, as the suite does)."""
    from kombu import Producer

    from django_app.celery import app

    monkeypatch.setattr(Producer, "publish", lambda self, *args, **kwargs: None)
    found = counts.Paths(app)
    yield found
    found.close()


def test_each_path_costs_what_is_pinned(paths, direct):
    vendor = connection.vendor
    ids = counts.Ids()
    flushing = vendor != "mysql" or _innodb_flushes()
    for name in counts.PATHS:
        found = counts.count_path(paths, ids, name, 3, direct)
        statements, round_trips, commits, flushes = PINNED[vendor][name]
        if flushes is None:
            flushes = commits if vendor == "mysql" and flushing else 0
        assert (found["statements"], found["round_trips"], found["commits"],
                found["flushes"]) == (statements, round_trips, commits, flushes), name
        if vendor == "postgresql" and name in PINNED_ROWS:
            assert (found["index_entries"], found["updates"], found["hot_updates"]) \
                == PINNED_ROWS[name], name
