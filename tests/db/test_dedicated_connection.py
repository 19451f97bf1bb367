"""The worker's own bookkeeping connection: it outlives Celery's per-task reconnect."""

from __future__ import annotations

import os
import threading

import pytest
from django.conf import settings
from django.db import connections

from celery_idem import claims
from celery_idem.backends import get_backend, routines
from celery_idem.backends.generic import GenericBackend
from celery_idem.connection import (
    bookkeeping_connection,
    close_bookkeeping_connections,
    open_count,
    release_bookkeeping,
)
from celery_idem.models import Job
from celery_idem.producer import write_intent
from django_app.effects.tasks import ship_order

pytestmark = pytest.mark.django_db(transaction=True)
on_postgres = settings.DATABASE_KIND == "postgres"


@pytest.fixture(autouse=True)
def _closed_after():
    yield
    close_bookkeeping_connections()  # the test database is dropped at the end


def claim(n):
    intent = ship_order.intent((n,))
    write_intent(intent, f"pub-{n}")
    return claims.acquire(intent, worker="h/1", task_id=f"t-{n}", lease_seconds=60,
                          using="default", dedicated=True)[1]


def test_dedicated_claims_commit_and_are_seen_by_django_at_once():
    """Claim and commit on the dedicated connection are visible to Django's connection."""
    c = claim(1)
    assert Job.objects.get(key="ship/1").state == "RUNNING"
    assert c.succeed({"ok": 1})
    assert Job.objects.get(key="ship/1").result == {"ok": 1}


@pytest.mark.skipif(on_postgres, reason="SQLite only: PostgreSQL has the connection")
def test_sqlite_bookkeeping_shares_djangos_connection():
    """On SQLite, where connecting is free, the portable backend uses Django's."""
    assert isinstance(get_backend("default", dedicated=True), GenericBackend)
    claim(2).succeed(2)
    assert Job.objects.get(key="ship/2").state == "SUCCEEDED"


@pytest.mark.skipif(not on_postgres, reason="the dedicated connection is PostgreSQL's")
def test_the_dedicated_connection_survives_closing_djangos_connections():
    """What Celery's fixup does before and after every task does not reconnect it."""
    claim(2).succeed(2)
    before = bookkeeping_connection("default").connection
    connections.close_all()
    claim(3).succeed(3)
    assert bookkeeping_connection("default").connection is before
    assert bookkeeping_connection("default") is not connections["default"]


@pytest.fixture
def commit_modes():
    """The synchronous_commit each commit that wrote a job row ran with, read by a deferred
    trigger (it fires in the commit, where a transaction-scoped setting still holds):
    a function returning [(state, mode), ...] in commit order."""
    with connections["default"].cursor() as cursor:
        cursor.execute(COMMIT_MODES)
    yield lambda: [tuple(row) for row in _rows(
        "SELECT state, mode FROM idem_commit_mode ORDER BY id")]
    with connections["default"].cursor() as cursor:
        cursor.execute("DROP TABLE idem_commit_mode;"
                       " DROP TRIGGER idem_commit_mode ON celery_idem_job;"
                       " DROP FUNCTION idem_note_commit_mode()")


COMMIT_MODES = """
CREATE TABLE idem_commit_mode (id serial PRIMARY KEY, state text, mode text);
CREATE FUNCTION idem_note_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO idem_commit_mode (state, mode)
    VALUES (NEW.state, current_setting('synchronous_commit'));
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER idem_commit_mode AFTER INSERT OR UPDATE ON celery_idem_job
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION idem_note_commit_mode();
"""


def _rows(sql):
    with connections["default"].cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


def _synchronous_commit(wrapper):
    with wrapper.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


@pytest.mark.skipif(not on_postgres, reason="the dedicated connection is PostgreSQL's")
@pytest.mark.parametrize("way", ["routines", "statements"])
def test_claims_and_commits_do_not_wait_for_the_flush_per_transaction(settings, commit_modes,
                                                                      monkeypatch, way):
    """On the bookkeeping connection a claim and a commit commit with synchronous_commit
    off, set for their own transaction: the session's setting is the server's, as on
    Django's connection, and an intent's commit keeps it (flushed). The setting turns the
    unflushed commits off. The same through the stored routines, which set it themselves
    (backends/routines.py), and through the statements (pipelined: backends/pipeline.py)."""
    routines.forget()
    if way == "statements":
        monkeypatch.setattr(routines, "calls", lambda connection: {})
    else:
        assert routines.calls(connections["default"]), "the initial migration installs them"
    server = _synchronous_commit(connections["default"])
    assert server != "off", "this test needs a server that flushes by default"
    claim(5).succeed(5)
    assert commit_modes() == [("PENDING", server), ("RUNNING", "off"), ("SUCCEEDED", "off")]
    assert _synchronous_commit(bookkeeping_connection("default")) == server
    settings.CELERY_IDEM_SYNCHRONOUS_COMMIT = True
    claim(6).succeed(6)
    assert commit_modes()[3:] == [("PENDING", server), ("RUNNING", server),
                                  ("SUCCEEDED", server)]


postgres_only = pytest.mark.skipif(not on_postgres,
                                   reason="the dedicated connection is PostgreSQL's")


@postgres_only
def test_the_outbox_marks_its_message_sent_without_waiting_for_the_flush(commit_modes):
    """Published inside ``atomic()``: the intent commits with the caller's transaction
    and the server's durability; the mark that its message left comes after, on the
    bookkeeping connection, unflushed (a lost mark re-sends a message the key answers)."""
    from django.db import transaction

    server = _synchronous_commit(connections["default"])
    assert server != "off", "this test needs a server that flushes by default"
    with transaction.atomic():
        ship_order.delay(9)
    job = Job.objects.get(key="ship/9")
    assert job.sent_at is not None
    assert commit_modes() == [("PENDING", server), ("PENDING", "off")]


def _in_thread(fn):
    """Run ``fn`` in a new thread and return its result (or raise its exception)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            out["error"] = exc
        finally:
            connections.close_all()  # this thread's Django connections

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _backend_pid(wrapper):
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


@postgres_only
def test_each_thread_holds_its_own_connection_at_once():
    """-P threads / gevent: two holders at the same time never share a connection, and a
    wrapper opened in one thread is usable by the next holder in another."""
    barrier = threading.Barrier(3, timeout=30)

    def hold():
        wrapper = bookkeeping_connection("default")
        pid = _backend_pid(wrapper)
        barrier.wait()  # all three hold theirs at the same time
        assert _backend_pid(bookkeeping_connection("default")) == pid  # same while held
        barrier.wait()
        release_bookkeeping()
        connections.close_all()
        return pid

    threads = [threading.Thread(target=lambda: pids.append(hold())) for _ in range(3)]
    pids: list[int] = []
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(pids) == 3 and len(set(pids)) == 3
    assert open_count() == 3
    # Released connections are reused by later threads, not reopened.
    assert _in_thread(lambda: _backend_pid(bookkeeping_connection("default"))) in pids
    assert open_count() == 3


@postgres_only
def test_claims_from_several_threads_commit():
    """What the threads pool does: claim and commit in worker threads (before the
    per-thread connections, Django refused a wrapper created in another thread)."""
    claim(10).succeed(10)  # the main thread's connection, released to the idle ones
    release_bookkeeping()
    for n in range(11, 14):
        _in_thread(lambda n=n: (claim(n).succeed(n), release_bookkeeping()))
    assert Job.objects.filter(state="SUCCEEDED").count() == 4
    assert open_count() == 1


@postgres_only
def test_a_forked_child_opens_its_own_connection():
    """The parent's connection object is never used in a forked child."""
    parent = _backend_pid(bookkeeping_connection("default"))
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.write(write, str(_backend_pid(bookkeeping_connection("default"))).encode())
            close_bookkeeping_connections()
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    assert int(os.read(read, 64) or b"0") not in (0, parent)
    os.close(read)
    assert _backend_pid(bookkeeping_connection("default")) == parent
