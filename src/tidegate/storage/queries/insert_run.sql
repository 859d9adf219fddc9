-- Insert one run: insert_runs.sql for a batch of one, without the batch machinery (the
-- JSON parse, the per-key join, the window, the sorts), which cost more than the insert
-- itself for a single run. Same clock (the key's next step: next_vtime), same
-- idempotency and uniqueness rule (ON CONFLICT, only for a run with an idempotency or
-- unique key: the caller reads the original with find_runs_by_key or find_unique_runs),
-- same NOTIFY when the run is ready. One of the two inserts makes a row, the other's
-- one-time filter stops it before its clock is read.
-- in_line: whether the run joins its key's line (an ordered key: key_in_line).
-- declared: a run of a task the enqueuing app does not have comes with its lane,
-- priority and max_attempts NULL unless the enqueue gave them; its workers' declaration
-- (tidegate.tasks; tasks_pkey, one probe) fills them, else the defaults, in this
-- statement rather than a round trip before it.
WITH run AS (
    SELECT %(project)s::text AS project,
           coalesce(%(lane)s::text, declared.lane, 'default') AS lane, %(key)s::text AS key,
           %(task)s::text AS task, %(args)s::jsonb AS args,
           coalesce(%(priority)s::smallint, declared.priority, 0) AS priority,
           coalesce(%(max_attempts)s::smallint, declared.max_attempts,
                    %(default_max_attempts)s::smallint) AS max_attempts,
           coalesce(%(scheduled_at)s::timestamptz, now()) AS scheduled_at,
           %(idempotency_key)s::text AS idempotency_key,
           %(unique_key)s::text AS unique_key,
           %(unique_states)s::run_state[] AS unique_states,
           %(trace_context)s::jsonb AS trace_context,
           CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled'
                ELSE 'available' END::run_state AS state
    FROM (SELECT) AS one
    LEFT JOIN tasks AS declared ON declared.name = %(task)s::text
),
plain AS (
    INSERT INTO runs (project, lane, key, task, args, priority, max_attempts,
                      scheduled_at, idempotency_key, unique_key, unique_states, trace_context,
                      state, vtime, in_line)
    SELECT *, next_vtime(lane, key), key_in_line(lane, key) FROM run
    WHERE %(idempotency_key)s::text IS NULL AND %(unique_key)s::text IS NULL
    RETURNING id, state, lane, priority, max_attempts, project, idempotency_key, unique_key,
              vtime
),
keyed AS (
    INSERT INTO runs (project, lane, key, task, args, priority, max_attempts,
                      scheduled_at, idempotency_key, unique_key, unique_states, trace_context,
                      state, vtime, in_line)
    SELECT *, next_vtime(lane, key), key_in_line(lane, key) FROM run
    WHERE %(idempotency_key)s::text IS NOT NULL OR %(unique_key)s::text IS NOT NULL
    ON CONFLICT DO NOTHING  -- runs_idempotency, runs_unique
    RETURNING id, state, lane, priority, max_attempts, project, idempotency_key, unique_key,
              vtime
),
inserted AS (
    SELECT * FROM plain UNION ALL SELECT * FROM keyed
),
notified AS (
    SELECT count(pg_notify(%(channel)s, lane)) AS lanes
    FROM inserted WHERE state = 'available'
)
SELECT inserted.id, inserted.vtime, inserted.lane, inserted.priority, inserted.max_attempts,
       inserted.project, inserted.idempotency_key, inserted.unique_key, now() AS at
FROM inserted, notified
