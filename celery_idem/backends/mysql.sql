-- The MySQL/MariaDB backend's statements (backends/mysql.py): the hot path's moves that
-- record no history, written out instead of built by the ORM on every call. Named
-- queries as in postgresql.sql: {job} and {row} are filled in once, {guard} and {sets}
-- per move from the move table (celery_idem.states). MySQL has no UPDATE ... RETURNING,
-- so a claim is its UPDATE and then `row`, the attempt it took read back. `key` is a
-- reserved word here.

-- name: guard_fenced
attempt = %(attempt)s

-- name: guard_same_arguments
fingerprint = %(fingerprint)s

-- name: guard_claimable
(not_before IS NULL OR not_before <= %(now)s OR task_id = %(task_id)s)

-- name: guard_lease_expired
lease_expires_at < %(now)s

-- name: guard_same_dispatch
dispatch_count = %(dispatch_count)s

-- name: insert
-- The intent (PENDING), or a claim whose intent is missing (RUNNING, attempt 1); a key
-- that exists fails it on the unique key, and the row is read with `row`.
INSERT INTO {job} (namespace, `key`, task_name, args, kwargs, fingerprint, options, state,
                   attempt, worker, task_id, lease_expires_at, dispatch_count,
                   created_at, started_at, updated_at, parent_id, message, not_before,
                   expires_at, sent_at)
VALUES (%(namespace)s, %(key)s, %(task_name)s, %(args)s, %(kwargs)s, %(fingerprint)s,
        %(options)s, %(to_state)s, %(attempt)s, %(worker)s, %(task_id)s,
        %(lease_expires_at)s, 0, %(now)s, %(started_at)s, %(now)s, %(parent)s,
        %(message)s, %(not_before)s, %(expires_at)s, %(sent_at)s)

-- name: insert_many
-- A batch's intents (PENDING) in one statement, {values} one `insert_many_row` each; a
-- key that exists changes nothing (a no-op assignment: INSERT IGNORE would also drop,
-- silently, a row that breaks any other constraint). The rows of the batch's keys are
-- then read with `rows_of_keys`.
INSERT INTO {job} (namespace, `key`, task_name, args, kwargs, fingerprint, options, state,
                   attempt, worker, task_id, lease_expires_at, dispatch_count,
                   created_at, started_at, updated_at, parent_id, message, not_before,
                   expires_at, sent_at)
VALUES {values}
ON DUPLICATE KEY UPDATE namespace = namespace

-- name: insert_many_row
(%s, %s, %s, %s, %s, %s, %s, %s, 0, '', %s, NULL, 0, %s, NULL, %s, %s, %s, %s, %s, %s)

-- name: rows_of_keys
-- {keys}: a placeholder per key of the namespace.
SELECT `key`, created_at, {row} FROM {job} WHERE namespace = %s AND `key` IN ({keys})

-- name: claim
UPDATE {job}
SET state = %(running)s, attempt = attempt + 1, worker = %(worker)s, task_id = %(task_id)s,
    lease_expires_at = %(lease_expires_at)s, not_before = NULL, started_at = %(now)s,
    updated_at = %(now)s
WHERE `key` = %(key)s AND namespace = %(namespace)s AND state = %(source)s AND {guard}

-- name: row
SELECT {row} FROM {job} WHERE `key` = %(key)s AND namespace = %(namespace)s

-- name: move
UPDATE {job} SET state = %(to_state)s, updated_at = %(now)s{sets}
WHERE id = %(id)s AND state = %(from_state)s AND {guard}

-- name: pending_ids
-- {ids}: "AND id IN (...)" with a placeholder per id, or nothing.
SELECT id FROM {job} WHERE state = %s {ids} ORDER BY id LIMIT %s

-- name: pending_unlocked
-- Of those, the rows no open transaction holds: an atomic body's claim holds its row with
-- an exclusive lock, which a shared lock skips. {ids}: a placeholder per id.
SELECT id FROM {job} WHERE state = %s AND id IN ({ids}) {share} SKIP LOCKED
