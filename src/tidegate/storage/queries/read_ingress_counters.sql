-- Webhook answers for GET /metrics (ingress_counters): the counts of the max_projects
-- projects with the most requests by (project, mode, outcome, status), those of all
-- the others summed under '(other)', so the totals add up; and the time to answer by
-- (mode, outcome) over every project. One row per (project, mode, outcome, status) is
-- read: a few per project that was ever sent a webhook (bench/metrics.py measures it).
WITH busiest AS (
    SELECT project FROM ingress_counters
    GROUP BY project
    ORDER BY sum(requests) DESC, project
    LIMIT %(max_projects)s
)
SELECT 'count' AS kind,
       CASE WHEN project IN (SELECT project FROM busiest) THEN project ELSE '(other)' END
           AS project,
       mode, outcome, status,
       sum(requests)::bigint AS requests,
       NULL::float8 AS seconds,
       NULL::bigint[] AS buckets
FROM ingress_counters
GROUP BY 2, mode, outcome, status
UNION ALL
SELECT 'time', NULL, mode, outcome, NULL,
       sum(requests)::bigint,
       sum(seconds)::float8,
       ARRAY[
           sum(buckets[1]), sum(buckets[2]), sum(buckets[3]), sum(buckets[4]),
           sum(buckets[5]), sum(buckets[6]), sum(buckets[7]), sum(buckets[8]),
           sum(buckets[9]), sum(buckets[10]), sum(buckets[11]), sum(buckets[12]),
           sum(buckets[13]), sum(buckets[14]), sum(buckets[15])
       ]::bigint[]
FROM ingress_counters
GROUP BY mode, outcome
ORDER BY 1, 2, 3, 4, 5
