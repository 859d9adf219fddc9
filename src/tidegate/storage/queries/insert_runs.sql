-- Insert a batch of runs in one statement and wake the workers of each lane that got a
-- ready run.
-- The batch arrives as one JSON array (one parameter, parsed by the server in C): far
-- cheaper on the client than nine arrays of 10,000 values. ORDER BY ord hands out ids
-- in input order, so the caller can match the returned rows to its input.
-- clock: also whether each key's runs join its line (an ordered key: key_in_line).
-- clock: each (lane, key) of the batch starts at key_clock (after the key's newest ready
-- run, never before the lane's floor; two index probes) and its runs take consecutive
-- steps of 1/weight: a batch of one key spreads over virtual time, it does not jump
-- the line. Delayed runs are stamped again when they come due (stage_runs).
-- ON CONFLICT: a repeated idempotency key, or the unique key of a run that holds it,
-- inserts nothing; the caller reads the original run with find_runs_by_key or
-- find_unique_runs. The unique index (runs_idempotency, runs_unique) waits for a
-- concurrent insert of the same key to commit or abort, so exactly one of two
-- duplicates inserts. Only runs with either key go through it (keyed): ON CONFLICT inserts speculatively, a second
-- WAL record per row, for rows the index would never hold (measured on 20,000 runs
-- without a key: 749 WAL bytes per run with it, 677 without, at 1.05 times the rate). Each of
-- the two inserts hands out ids in input order among its own runs.
-- notified: one NOTIFY per lane (PostgreSQL folds identical payloads in a transaction);
-- it is only a hint, workers also poll.
-- The result is what the caller cannot know: each run's id, place on its key's clock,
-- lane, priority and max_attempts (declared ones filled in), and the statement's time,
-- from which it makes each run's state, scheduled_at and inserted_at as the insert did
-- (a run whose scheduled_at is after it is 'scheduled').
-- declared: a run of a task the enqueuing app does not have comes without lane, priority
-- and max_attempts unless the enqueue gave them; its workers' declaration
-- (tidegate.tasks, a hash of its few rows) fills them, else the defaults, in this
-- statement rather than a round trip before it.
WITH batch AS (
    SELECT i.project, coalesce(i.lane, declared.lane, 'default') AS lane, i.key, i.task,
           i.args, coalesce(i.priority, declared.priority, 0) AS priority,
           coalesce(i.max_attempts, declared.max_attempts,
                    %(default_max_attempts)s::smallint) AS max_attempts,
           i.scheduled_at, i.idempotency_key, i.unique_key, i.unique_states,
           i.trace_context, i.ord
    FROM ROWS FROM (jsonb_to_recordset(%(runs)s::jsonb) AS (
        project text, lane text, key text, task text, args jsonb, priority smallint,
        max_attempts smallint, scheduled_at timestamptz, idempotency_key text,
        unique_key text, unique_states run_state[], trace_context jsonb
    )) WITH ORDINALITY AS i(project, lane, key, task, args, priority, max_attempts,
                            scheduled_at, idempotency_key, unique_key, unique_states,
                            trace_context, ord)
    LEFT JOIN tasks AS declared ON declared.name = i.task
),
clock AS MATERIALIZED (  -- once per key, not per run
    SELECT lane, key, key_clock(lane, key) AS start, key_weight(lane, key) AS weight,
           key_in_line(lane, key) AS in_line
    FROM (SELECT DISTINCT lane, key FROM batch) AS keys
),
stamped AS (
    SELECT b.project, b.lane, b.key, b.task, b.args, b.priority, b.max_attempts,
           coalesce(b.scheduled_at, now()) AS scheduled_at, b.idempotency_key,
           b.unique_key, b.unique_states, b.trace_context,
           CASE WHEN b.scheduled_at > now() THEN 'scheduled' ELSE 'available' END::run_state
               AS state,
           c.start + row_number() OVER (PARTITION BY b.lane, b.key ORDER BY b.ord) / c.weight
               AS vtime,
           c.in_line, b.ord
    FROM batch b JOIN clock c ON c.lane = b.lane AND c.key = b.key
),
plain AS (
    INSERT INTO runs (project, lane, key, task, args, priority, max_attempts,
                      scheduled_at, idempotency_key, unique_key, unique_states, trace_context,
                      state, vtime, in_line)
    SELECT project, lane, key, task, args, priority, max_attempts,
           scheduled_at, idempotency_key, unique_key, unique_states, trace_context,
           state, vtime, in_line
    FROM stamped WHERE idempotency_key IS NULL AND unique_key IS NULL
    ORDER BY ord
    RETURNING id, state, lane, priority, max_attempts, project, idempotency_key, unique_key,
              vtime
),
keyed AS (
    INSERT INTO runs (project, lane, key, task, args, priority, max_attempts,
                      scheduled_at, idempotency_key, unique_key, unique_states, trace_context,
                      state, vtime, in_line)
    SELECT project, lane, key, task, args, priority, max_attempts,
           scheduled_at, idempotency_key, unique_key, unique_states, trace_context,
           state, vtime, in_line
    FROM stamped WHERE idempotency_key IS NOT NULL OR unique_key IS NOT NULL
    ORDER BY ord
    ON CONFLICT DO NOTHING  -- runs_idempotency, runs_unique
    RETURNING id, state, lane, priority, max_attempts, project, idempotency_key, unique_key,
              vtime
),
inserted AS (
    SELECT * FROM plain UNION ALL SELECT * FROM keyed
),
notified AS (
    SELECT count(pg_notify(%(channel)s, lane)) AS lanes
    FROM (SELECT DISTINCT lane FROM inserted WHERE state = 'available') AS ready
)
SELECT inserted.id, inserted.vtime, inserted.lane, inserted.priority, inserted.max_attempts,
       inserted.project, inserted.idempotency_key, inserted.unique_key, now() AS at
FROM inserted, notified
