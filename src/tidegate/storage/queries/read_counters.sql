-- The attempts finished, by (task, lane, outcome), summed over the rows of the live
-- workers and of 'retired' (worker_counters): at most max_series series, in name
-- order. The table holds a few rows per live worker, so a scan is cheap.
SELECT task, lane, outcome,
       sum(attempts)::bigint AS attempts,
       sum(seconds)::float8 AS seconds,
       sum_buckets(buckets) AS buckets
FROM worker_counters
GROUP BY task, lane, outcome
ORDER BY task, lane, outcome
LIMIT %(max_series)s
