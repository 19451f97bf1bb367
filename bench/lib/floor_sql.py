"""The floor's statements: the bare protocol in raw SQL, shared by ``bench.floor``
(bench/lib/raw_app.py, no Django) and ``bench.floor_django`` (the plain Django task with them
around its ORM create, bench/lib/tasks.py). Plain strings, no imports, so
the app without Django can use them.

The claim is one statement that wins from no row (or a PENDING one) and returns the
attempt; the commit is fenced by it. MySQL/MariaDB have no RETURNING: the claim is an
INSERT there, and a key that exists is claimed by a guarded UPDATE, then its attempt read.
"""

#: The floor's own table, per Django vendor (the end-to-end suite makes it before each run).
TABLE = {
    "postgresql": "CREATE TABLE IF NOT EXISTS bench_floor_job (key text PRIMARY KEY,"
                  " state text NOT NULL, attempt integer NOT NULL, result jsonb,"
                  " updated_at timestamptz NOT NULL DEFAULT now())",
    "mysql": "CREATE TABLE IF NOT EXISTS bench_floor_job (`key` varchar(255) PRIMARY KEY,"
             " state varchar(16) NOT NULL, attempt integer NOT NULL, result json,"
             " updated_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))",
}

#: The floor's intent, written before its message leaves (``floor-intent``, ``pub-floor``):
#: a PENDING row of the key alone, committed as the server's own setting says (flushed by
#: default), as the library's intent is. The least a durable intent at publish costs; one
#: that recovery could re-send from would also hold the message. (key,)
INTENT = {
    "postgresql": "INSERT INTO bench_floor_job (key, state, attempt) VALUES (%s, 'PENDING', 0)",
    "mysql": "INSERT INTO bench_floor_job (`key`, state, attempt) VALUES (%s, 'PENDING', 0)",
}

#: PostgreSQL's claim: (key,) -> one row (attempt,), or none when the key is taken.
CLAIM = ("INSERT INTO bench_floor_job (key, state, attempt) VALUES (%s, 'RUNNING', 1)"
         " ON CONFLICT (key) DO UPDATE SET state = 'RUNNING',"
         " attempt = bench_floor_job.attempt + 1, updated_at = now()"
         " WHERE bench_floor_job.state = 'PENDING' RETURNING attempt")

#: MySQL/MariaDB's claim, in three: the INSERT; on a duplicate key the guarded UPDATE
#: (rowcount 1: won) and the read of the attempt.
CLAIM_MYSQL = (
    "INSERT INTO bench_floor_job (`key`, state, attempt) VALUES (%s, 'RUNNING', 1)",
    "UPDATE bench_floor_job SET state = 'RUNNING', attempt = attempt + 1"
    " WHERE `key` = %s AND state = 'PENDING'",
    "SELECT attempt FROM bench_floor_job WHERE `key` = %s",
)

#: The commit, fenced by the attempt: (result as JSON text, key, attempt).
COMMIT = {
    "postgresql": "UPDATE bench_floor_job SET state = 'SUCCEEDED', result = %s::jsonb,"
                  " updated_at = now() WHERE key = %s AND attempt = %s",
    "mysql": "UPDATE bench_floor_job SET state = 'SUCCEEDED', result = %s,"
             " updated_at = UTC_TIMESTAMP(6) WHERE `key` = %s AND attempt = %s",
}
