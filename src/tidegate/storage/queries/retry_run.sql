-- Run finished runs again, in the lane the caller names ('manual' for one run, 'default'
-- for many): 'available' at once, with one more attempt allowed if they had spent them
-- all, stamped on their key's clock in that lane (see insert_runs), so a bulk retry
-- of one key takes its fair share and does not jump the line.
-- A retried run drops its unique key (tidegate.unique): a retry is a decision of its
-- own, and a newer run may hold the key by now, which the retried run would collide with.
WITH target AS (
    SELECT id, key FROM runs
    WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('succeeded', 'discarded', 'cancelled')
    FOR UPDATE
),
clock AS MATERIALIZED (  -- once per key, not per run
    SELECT key, key_clock(%(lane)s, key) AS start, key_weight(%(lane)s, key) AS weight
    FROM (SELECT DISTINCT key FROM target) AS keys
),
retried AS (
    UPDATE runs
    SET state = 'available', lane = %(lane)s, scheduled_at = now(), completed_at = NULL,
        max_attempts = greatest(max_attempts, attempt + 1),
        vtime = stamped.vtime, unique_key = NULL, unique_states = NULL
    FROM (
        SELECT target.id,
               clock.start + row_number() OVER (PARTITION BY target.key ORDER BY target.id)
                             / clock.weight AS vtime
        FROM target JOIN clock ON clock.key = target.key
    ) AS stamped
    WHERE runs.id = stamped.id
    RETURNING runs.*
),
notified AS (
    SELECT count(pg_notify(%(channel)s, %(lane)s)) AS lanes
    FROM (SELECT 1 FROM retried LIMIT 1) AS any_retried
)
SELECT retried.* FROM retried, notified
