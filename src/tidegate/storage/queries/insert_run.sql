-- Insert one run: insert_runs.sql for a batch of one, without the batch machinery (the
-- JSON parse, the per-key join, the window, the sorts), which cost more than the insert
-- itself for a single run. Same clock (the key's next step: key_clock + 1/weight), same
-- idempotency rule (ON CONFLICT: the caller reads the original with find_runs_by_key),
-- same NOTIFY when the run is ready.
WITH inserted AS (
    INSERT INTO runs (project, lane, key, task, args, priority, max_attempts,
                      scheduled_at, idempotency_key, state, vtime)
    VALUES (%(project)s, %(lane)s, %(key)s, %(task)s, %(args)s::jsonb, %(priority)s,
            %(max_attempts)s, coalesce(%(scheduled_at)s::timestamptz, now()),
            %(idempotency_key)s,
            CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled'
                 ELSE 'available' END::run_state,
            key_clock(%(lane)s, %(key)s) + 1 / key_weight(%(lane)s, %(key)s))
    ON CONFLICT (project, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, state, lane, scheduled_at, inserted_at, project, idempotency_key, vtime
),
notified AS (
    SELECT count(pg_notify(%(channel)s, lane)) AS lanes
    FROM inserted WHERE state = 'available'
)
SELECT inserted.id, inserted.state, inserted.scheduled_at, inserted.inserted_at,
       inserted.project, inserted.idempotency_key, inserted.vtime
FROM inserted, notified
