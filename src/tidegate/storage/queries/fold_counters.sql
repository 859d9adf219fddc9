-- Fold the counters of workers that are no longer live (no heartbeat within
-- live_seconds: they died, or stopped without reaching the database) into the rows of
-- worker_id 'retired', so that the table stays small and the sums never go back.
-- SKIP LOCKED: a row that a heartbeat or another fold is writing is left for the next
-- round, and no row is folded twice. Folding a worker that is only late is harmless:
-- its next heartbeat adds its new counts to new rows.
WITH gone AS (
    SELECT worker_id, task, lane, outcome FROM worker_counters
    WHERE worker_id <> 'retired'
      AND worker_id NOT IN (
          SELECT id FROM workers
          WHERE heartbeat_at > now() - make_interval(secs => %(live_seconds)s::float8)
      )
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
folded AS (
    DELETE FROM worker_counters AS c USING gone
    WHERE (c.worker_id, c.task, c.lane, c.outcome)
        = (gone.worker_id, gone.task, gone.lane, gone.outcome)
    RETURNING c.task, c.lane, c.outcome, c.attempts, c.seconds, c.buckets
),
retired AS (
    INSERT INTO worker_counters AS c (worker_id, task, lane, outcome, attempts, seconds, buckets)
    SELECT 'retired', task, lane, outcome, sum(attempts), sum(seconds), sum_buckets(buckets)
    FROM folded
    GROUP BY task, lane, outcome
    -- The same order in every fold, so that two folds lock the retired rows alike.
    ORDER BY task, lane, outcome
    ON CONFLICT (worker_id, task, lane, outcome) DO UPDATE
    SET attempts = c.attempts + excluded.attempts,
        seconds = c.seconds + excluded.seconds,
        buckets = add_buckets(c.buckets, excluded.buckets)
)
SELECT count(*) AS folded FROM folded
