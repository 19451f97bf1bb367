"""How many other sessions on the test database wait for a row lock right now, on the
databases that have row locks (PostgreSQL, MariaDB/MySQL), read from the server's own
views: a test waits for that instead of sleeping."""

from __future__ import annotations

from django.db import connection

#: The databases with row locks a test can watch another session wait on.
ROW_LOCKING = ("postgresql", "mysql")
#: How often to poll ``lock_waiters``: InnoDB refreshes its INNODB_TRX view only when it
#: was not read for 0.1 s, so a faster poll would read the same old picture forever.
POLL_SECONDS = 0.25


def lock_waiters() -> int:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Inside a transaction the statistics views keep their first snapshot.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid <> "
                           "pg_backend_pid() AND wait_event_type = 'Lock' "
                           "AND datname = current_database()")
        else:
            # InnoDB's transactions in LOCK WAIT, on this database's sessions only
            # (other test runs share the server).
            cursor.execute("SELECT count(*) FROM information_schema.INNODB_TRX t "
                           "JOIN information_schema.PROCESSLIST p "
                           "ON p.ID = t.trx_mysql_thread_id "
                           "WHERE t.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()")
        return int(cursor.fetchone()[0])
