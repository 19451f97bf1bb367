"""A claim and a commit do not log the job's message again (PostgreSQL's WAL).

The message (the envelope kept for re-sends) is most of a job row and is written once,
by the intent. A claim or a commit rewrites the row; what PostgreSQL logs for that must
not grow with the message: either the row's new version stays on its page (fillfactor
70, celery_idem/schema.py) and the record holds only the changed middle of the row, or
the message is out of line in TOAST and only its pointer is copied. Measured with
pg_walinspect on this database's records only (the server is shared), as a structural
bound: a message 20 KB larger may not cost the claim and commit anywhere near that.

Each job is measured alone in the table (emptied first), so its page has room for the
new versions. Where it has none and nothing on it can be pruned (many wide rows on the
page, or another session's snapshot holding their dead versions), the new version goes
to another page and PostgreSQL logs the whole row, message and all: measured, not
tested, by ``bench/experiments/2026-11-27-job-row-layouts/wal_layouts.py`` (orders
``backlog`` and ``held``; docs/decisions/2026-11-25-no-hot-cold-split.md).
"""

from __future__ import annotations

import os
import uuid

import pytest
from django.conf import settings
from django.db import OperationalError, ProgrammingError, connection
from django.utils import timezone

from celery_idem import claims
from celery_idem.backends import Intent, get_backend
from celery_idem.models import Job

pytestmark = [
    pytest.mark.skipif(settings.DATABASE_KIND != "postgres",
                       reason="WAL is PostgreSQL's (pg_walinspect, PostgreSQL 15+)"),
    pytest.mark.django_db(transaction=True),
]

#: Bytes the claim and commit of a wide-message job may log beyond a tiny one's: index
#: entries and record headers do not depend on the message; this leaves room for a page
#: split or a prune landing in one measurement and not the other.
SLACK = 600


@pytest.fixture
def walinspect():
    try:
        with connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except (OperationalError, ProgrammingError) as exc:
        pytest.skip(f"pg_walinspect unavailable: {exc}")


def lsn(function: str = "pg_current_wal_insert_lsn") -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}()")
        return str(cursor.fetchone()[0])


def wal_of_this_database(start: str, end: str) -> int:
    """Bytes of the records in [start, end) that touch a relation of this database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
        mine = f"%/{cursor.fetchone()[0]}/%"
        cursor.execute("SELECT coalesce(sum(record_length), 0)"
                       " FROM pg_get_wal_records_info(%s, %s) WHERE block_ref LIKE %s",
                       [start, end, mine])
        return int(cursor.fetchone()[0])


def message_of(size: int) -> dict:
    """An envelope-shaped message with ``size`` bytes of random hex in a header (random,
    so compression cannot hide it)."""
    return {"v": 1, "headers": {"id": str(uuid.uuid4()), "task": "tests.wal",
                                "pad": os.urandom(size // 2).hex()},
            "body": [[1], {}, {}], "properties": {}, "routing_key": "q"}


def claim_and_commit_wal(size: int) -> int:
    """Write an intent with a message of ``size`` bytes, then claim and commit it, each
    autocommitted on Django's connection (synchronous commits: flushed, so readable);
    the WAL of the claim and the commit. The job is alone in the table (see above)."""
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {Job._meta.db_table} CASCADE")
    intent = Intent(namespace="tests.wal", key=f"wal-{size}-{uuid.uuid4().hex[:8]}",
                    task_name="tests.wal", fingerprint="fp", args=[1], kwargs={},
                    options={"queue": "q"}, message=message_of(size))
    get_backend("default").publish(intent, "t-intent", timezone.now())
    start = lsn()
    _, claim = claims.acquire(intent, worker="w/1", task_id="t-intent", lease_seconds=60,
                              using="default")
    assert claim is not None and claim.succeed("done")
    end = lsn("pg_current_wal_flush_lsn")
    job = Job.objects.get(key=intent.key)
    assert job.state == "SUCCEEDED" and job.message == intent.message
    return wal_of_this_database(start, end)


def test_claim_and_commit_do_not_log_the_message_again(walinspect):
    claim_and_commit_wal(0)  # the statements prepared, the table's first pages made
    tiny = claim_and_commit_wal(0)
    inline = claim_and_commit_wal(1_500)  # stays in the row (under the TOAST threshold)
    toasted = claim_and_commit_wal(20_000)  # out of line in TOAST
    assert tiny > 0
    assert inline - tiny < SLACK, (tiny, inline)
    assert toasted - tiny < SLACK, (tiny, toasted)
