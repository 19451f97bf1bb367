-- Every statement the PostgreSQL backend runs, by name (celery_idem/backends/postgresql.py).
--
-- Placeholders filled once when this file is loaded: {job}, {history} and {checkpoint}
-- (the tables), {row} (the columns of a JobRow), {history_insert} (the one INSERT of a
-- history line).
-- Filled per move from the move table (celery_idem/states.py): {sets}, {guard} (from
-- the guard_* fragments below) and {record} (the history CTE, when the move records;
-- with the start of the attempt the move ends, when it ends one: Move.ends_attempt).
-- Each step is one statement: data-modifying CTEs do the conditional write, append the
-- history line and, when the write did not match, return the row that stood in the way.

-- name: history_insert
INSERT INTO {history} (job_id, event, from_state, to_state, attempt, worker, task_id,
                       reason, actor, at, attempt_started_at)

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
-- The intent (PENDING), or a claim whose intent is missing (RUNNING, attempt 1), unless
-- the key exists: then the existing row comes back, not won.
WITH ins AS (
    INSERT INTO {job} (namespace, key, task_name, args, kwargs, fingerprint, options, state,
                       attempt, worker, task_id, lease_expires_at, dispatch_count,
                       created_at, started_at, updated_at, parent_id, message, not_before,
                       expires_at, sent_at)
    VALUES (%(namespace)s, %(key)s, %(task_name)s, %(args)s::jsonb, %(kwargs)s::jsonb,
            %(fingerprint)s, %(options)s::jsonb, %(to_state)s, %(attempt)s, %(worker)s,
            %(task_id)s, %(lease)s, 0, %(now)s, %(started_at)s, %(now)s, %(parent)s,
            %(message)s::jsonb, %(not_before)s, %(expires_at)s, %(sent_at)s)
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING {row}
){record}
SELECT true, false, {row} FROM ins
UNION ALL
SELECT false, false, {row} FROM {job}
WHERE namespace = %(namespace)s AND key = %(key)s AND NOT EXISTS (SELECT 1 FROM ins)

-- name: commit_new
-- An optimistic atomic body's commit (the ``committed`` move): the key's row inserted
-- finished, in the body's transaction, unless the key exists; then nothing, and the body
-- rolls back (its message then runs under a claim). The id of the row inserted.
WITH ins AS (
    INSERT INTO {job} (namespace, key, task_name, args, kwargs, fingerprint, options, state,
                       attempt, worker, task_id, dispatch_count, created_at, started_at,
                       updated_at, finished_at, parent_id, message, not_before,
                       expires_at, sent_at, result)
    VALUES (%(namespace)s, %(key)s, %(task_name)s, %(args)s::jsonb, %(kwargs)s::jsonb,
            %(fingerprint)s, %(options)s::jsonb, %(to_state)s, 1, %(worker)s, %(task_id)s,
            0, %(now)s, %(now)s, %(v_finished_at)s, %(v_finished_at)s, %(parent)s,
            %(message)s::jsonb, %(not_before)s, %(expires_at)s, %(sent_at)s,
            %(v_result)s::json)
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING id
)
SELECT id FROM ins

-- name: insert_batch
-- Many intents in one statement (a batch: celery_idem.batching), one row per distinct key,
-- the rows as one JSON array (one parameter: psycopg escapes each element of a text array
-- in Python, which cost more than the statement): the rows inserted come back won, the
-- rows whose key existed as they stood, each with its (namespace, key).
WITH v AS (
    SELECT * FROM json_to_recordset(%(rows)s::json)
        AS v (namespace text, key text, task_name text, fingerprint text, args jsonb,
              kwargs jsonb, options jsonb, task_id text, parent_id bigint, message jsonb,
              not_before timestamptz, expires_at timestamptz, sent_at timestamptz)
), ins AS (
    INSERT INTO {job} (namespace, key, task_name, args, kwargs, fingerprint, options, state,
                       attempt, worker, task_id, lease_expires_at, dispatch_count,
                       created_at, started_at, updated_at, parent_id, message, not_before,
                       expires_at, sent_at)
    SELECT namespace, key, task_name, args, kwargs, fingerprint, options, %(to_state)s, 0,
           '', task_id, NULL, 0, %(now)s, NULL, %(now)s, parent_id, message, not_before,
           expires_at, sent_at
    FROM v
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING namespace, key, {row}
){record}
SELECT true, false, namespace, key, {row} FROM ins
UNION ALL
SELECT false, false, namespace, key, {row} FROM {job}
WHERE (namespace, key) IN (SELECT namespace, key FROM v)
  AND (namespace, key) NOT IN (SELECT namespace, key FROM ins)

-- name: claim
-- The row is found by its unique key, then updated by primary key, and its state is
-- compared through an expression no index matches (``state || ''``). Otherwise, while
-- the statistics say PENDING rows are rare (after a burst of enqueues, until autoanalyze
-- runs), the planner prefers the (state, updated_at) index and one claim scans the whole
-- backlog for its key (tests/db/test_claim_plan.py). A claim that loses to a finished
-- row only reads it ({duplicate}: the history line, were the ``duplicate`` move recorded).
WITH target AS (
    SELECT id{start_read} FROM {job} WHERE namespace = %(namespace)s AND key = %(key)s
), claimed AS (
    UPDATE {job}
    SET state = %(to_state)s, attempt = attempt + 1, worker = %(worker)s,
        task_id = %(task_id)s, lease_expires_at = %(lease)s, not_before = NULL,
        started_at = %(now)s, updated_at = %(now)s
    WHERE id = (SELECT id FROM target) AND state || '' = %(from_state)s AND {guard}
    RETURNING {row}
){record}{duplicate}
SELECT true, false, {row} FROM claimed
UNION ALL
SELECT false, {duplicate_recorded}, {row} FROM {job}
WHERE id = (SELECT id FROM target) AND NOT EXISTS (SELECT 1 FROM claimed)

-- name: claim_start_read
-- A claim that ends an attempt (a take-over) keeps that attempt's start: the row as this
-- statement's snapshot saw it ({start_read} in "target"). Its UPDATE is guarded by the
-- attempt seen too (claim_start_guard): when another claim committed in between, the
-- UPDATE re-checks the row that claim left, whose attempt is one more, and matches
-- nothing. Only a claim writes started_at, always with a new attempt, so the start
-- seen is the start of the attempt taken over.
, attempt AS seen_attempt, started_at AS seen_start

-- name: claim_start_guard
attempt = (SELECT seen_attempt FROM target)

-- name: claim_start
(SELECT seen_start FROM target)

-- name: claim_duplicate
-- The history CTE of a lost claim on a finished key (appended to "claim" only while the
-- ``duplicate`` move records: it does not, so a replay's claim writes nothing).
, dup AS (
    {history_insert}
    SELECT id, %(duplicate)s, state, state, attempt, %(worker)s, %(task_id)s,
           %(duplicate_reason)s, '', %(now)s, NULL
    FROM {job}
    WHERE id = (SELECT id FROM target) AND state || '' = ANY(%(duplicate_sources)s)
      AND {duplicate_guard} AND NOT EXISTS (SELECT 1 FROM claimed)
    RETURNING 1
)

-- name: move
-- A move that writes the row: guarded by its source state and its guard.
WITH moved AS (
    UPDATE {job} SET state = %(to_state)s, updated_at = %(now)s{sets}
    WHERE id = %(id)s AND state = %(from_state)s AND {guard}
    RETURNING id, attempt{start_returning}
){record}
{result}

-- name: move_result
SELECT attempt FROM moved

-- name: move_result_final
-- The result of a move that ends its transaction (atomic mode's commit), sent with the
-- COMMIT in one round trip: a move that matched nothing divides by zero, failing the
-- statement, so the server skips the COMMIT queued behind it and the transaction (the
-- body's writes) rolls back. Only the executor can raise it: count(*) is not a constant.
SELECT 1 / count(*)::int FROM moved

-- name: move_record
-- The history CTE of a move that records (appended to "insert", "insert_batch", "claim",
-- "move", "move_batch" and "step_save"; {source} is the CTE that wrote the row). {start}:
-- the start of the attempt the move ends, or NULL. A move other than a claim does not
-- write started_at, so the value its RETURNING gives ({start_returning}) is the one
-- the row had; a claim's comes from claim_start.
, hist AS (
    {history_insert}
    SELECT id, %(event)s, %(from_state)s, %(to_state)s, attempt, {history_values}, %(now)s,
           {start}
    FROM {source}
)

-- name: start_returning
, started_at

-- name: record
-- A move that only appends a history line: the row is checked, not written. The line
-- says the state the row is in (a late finish meets SUCCEEDED as often as RUNNING), and
-- FOR SHARE waits for a write in flight (an atomic claim, a commit) and re-checks the
-- row it left, so the line follows that write in the history, or matches nothing.
{history_insert}
SELECT id, %(event)s, state, state, COALESCE(%(attempt)s, attempt),
       %(worker)s, %(task_id)s, %(reason)s, %(actor)s, %(now)s, NULL
FROM {job}
WHERE id = %(id)s AND state = ANY(%(sources)s) AND {guard}
FOR SHARE
RETURNING attempt

-- name: move_batch
-- Many fenced moves of one kind in one statement (recovery): per-row values as arrays.
WITH v AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(workers)s::text[],
                         %(task_ids)s::text[], %(reasons)s::text[]{arrays})
        AS v (id, attempt, h_worker, h_task_id, h_reason{names})
), moved AS (
    UPDATE {job} AS j SET state = %(to_state)s, updated_at = %(now)s{sets}
    FROM v WHERE j.id = v.id AND j.state = %(from_state)s AND j.attempt = v.attempt
    RETURNING j.id, j.attempt, v.h_worker, v.h_task_id, v.h_reason{start_returning}
){record}
SELECT id FROM moved

-- name: attempts_since_reset
SELECT %(attempt)s - COALESCE((
    SELECT attempt FROM {history} WHERE job_id = %(id)s AND event = %(reset)s
    ORDER BY id DESC LIMIT 1), 0)

-- name: job_rows_estimate
-- The planner's row count of the job table (negative: never analysed).
SELECT reltuples FROM pg_class WHERE oid = %(table)s::regclass

-- name: task_name_frequencies
-- The task names ANALYZE found most common, and the share of the rows each holds.
SELECT most_common_vals::text::text[], most_common_freqs FROM pg_stats
WHERE schemaname = current_schema() AND tablename = %(table)s AND attname = 'task_name'

-- name: task_names
-- A loose index scan: each step takes the next name from the (task_name, created_at)
-- index, one probe per name instead of a DISTINCT over every job.
WITH RECURSIVE names (name) AS (
    SELECT MIN(task_name) FROM {job}
    UNION ALL
    SELECT (SELECT MIN(task_name) FROM {job} WHERE task_name > names.name)
    FROM names WHERE names.name IS NOT NULL
)
SELECT name FROM names WHERE name IS NOT NULL LIMIT %(limit)s

-- name: step_save
-- A body's step checkpoint, fenced: stored only while the job is RUNNING under the
-- writer's attempt ({guard}). FOR SHARE waits for a concurrent take-over to commit and
-- re-checks the row it left, so a zombie attempt cannot add a step once a newer attempt
-- owns the job; a step already stored is kept. Returns (owned, inserted).
WITH owner AS (
    SELECT id FROM {job} WHERE id = %(id)s AND state = %(from_state)s AND {guard}
    FOR SHARE
), moved AS (
    INSERT INTO {checkpoint} (job_id, step, value, attempt, at)
    SELECT id, %(step)s, %(value)s::json, %(attempt)s, %(now)s FROM owner
    ON CONFLICT (job_id, step) DO NOTHING
    RETURNING job_id AS id, attempt
){record}
SELECT EXISTS (SELECT 1 FROM owner), EXISTS (SELECT 1 FROM moved)

-- name: step_read
-- As text: the caller parses it, whatever loader the connection has for json.
SELECT value::text FROM {checkpoint} WHERE job_id = %(id)s AND step = %(step)s

-- name: steps_clear
WITH gone AS (DELETE FROM {checkpoint} WHERE job_id = %(id)s RETURNING 1)
SELECT count(*) FROM gone

-- name: held_pending
-- PENDING rows an open transaction updated (an atomic body's claim, committed with the
-- body): the version this snapshot sees has that transaction's id as xmax, and every
-- transaction holds the lock on its own id until it ends. A read: no row is locked, so no
-- tuple is written (as a SKIP LOCKED probe would), and nothing waits. The claim is the
-- body transaction's own statement, not in a subtransaction, whose id would not match.
SELECT j.id, a.xact_start
FROM {job} AS j
JOIN pg_locks AS l ON l.locktype = 'transactionid' AND l.transactionid = j.xmax
    AND l.mode = 'ExclusiveLock' AND l.granted AND l.pid <> pg_backend_pid()
LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE j.state = %(pending)s AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
ORDER BY a.xact_start, j.id
LIMIT %(limit)s
