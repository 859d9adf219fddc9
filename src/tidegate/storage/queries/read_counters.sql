-- The attempts finished, by (task, lane, outcome), summed over the rows of the live
-- workers and of 'retired' (worker_counters): at most max_series series. The table
-- holds a few rows per live worker, so a scan is cheap.
-- Which series when there are more: each worker's (and 'retired''s) own busiest first,
-- taken in turns (a series comes at the best place any of its workers gives it, then in
-- name order). In name order alone, one worker's 1,000 names that sort first pushed
-- every other series out, and kept them out once folded into 'retired'.
-- The buckets are summed one subscript each, one per bucket of DURATION_BUCKETS and one
-- above (worker/counters.py): over 5,000 rows (bench/metrics.py) that takes 3 ms, the
-- sum_buckets aggregate 30 ms.
WITH placed AS (
    SELECT task, lane, outcome, attempts, seconds, buckets,
           row_number() OVER (
               PARTITION BY worker_id ORDER BY attempts DESC, task, lane, outcome
           ) AS place
    FROM worker_counters
),
series AS (
    SELECT task, lane, outcome,
           sum(attempts)::bigint AS attempts,
           sum(seconds)::float8 AS seconds,
           ARRAY[
               sum(buckets[1]), sum(buckets[2]), sum(buckets[3]), sum(buckets[4]),
               sum(buckets[5]), sum(buckets[6]), sum(buckets[7]), sum(buckets[8]),
               sum(buckets[9]), sum(buckets[10]), sum(buckets[11]), sum(buckets[12]),
               sum(buckets[13]), sum(buckets[14])
           ]::bigint[] AS buckets
    FROM placed
    GROUP BY task, lane, outcome
    ORDER BY min(place), task, lane, outcome
    LIMIT %(max_series)s
)
SELECT task, lane, outcome, attempts, seconds, buckets FROM series
ORDER BY task, lane, outcome
