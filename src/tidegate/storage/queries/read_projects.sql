-- The admission figures of the projects %(ids)s, in that order: the fast-lane cap (its
-- own, else %(default_cap)s) and the runs it counts (runs_fast_lane_inflight, at most
-- count_cap), the ingest rate and burst, the backlog cap, and the webhooks refused in
-- the last 15 minutes by the status they got (minute_counts holds outcomes: 429 for the
-- rate and the fast-lane cap, 503 for no worker, no capacity, a full backlog or the
-- database, 4xx for the rest). A project without a row (runs enqueued from code go to
-- 'default') shows the server's cap.
SELECT chosen.id,
       coalesce(projects.fast_lane_cap, %(default_cap)s::integer) AS fast_lane_cap,
       (SELECT count(*) FROM (
            SELECT 1 FROM runs
            WHERE runs.project = chosen.id AND runs.lane = 'fast_lane'
              AND runs.state IN ('scheduled', 'available', 'pending', 'running')
            LIMIT %(count_cap)s::integer
        ) AS held) AS fast_lane_in_flight,
       projects.ingest_rate,
       projects.ingest_burst,
       projects.backlog_cap,
       coalesce(refused.status_429, 0) AS refused_429,
       coalesce(refused.status_503, 0) AS refused_503,
       coalesce(refused.status_4xx, 0) AS refused_4xx
FROM unnest(%(ids)s::text[]) WITH ORDINALITY AS chosen(id, position)
LEFT JOIN projects ON projects.id = chosen.id
LEFT JOIN (
    SELECT project,
           sum(count) FILTER (WHERE outcome IN ('rate_limited', 'over_cap')) AS status_429,
           sum(count) FILTER (
               WHERE outcome IN ('no_worker', 'no_capacity', 'backlog_full', 'unavailable')
           ) AS status_503,
           sum(count) FILTER (
               WHERE outcome NOT IN ('rate_limited', 'over_cap', 'no_worker', 'no_capacity',
                                     'backlog_full', 'unavailable')
           ) AS status_4xx
    FROM minute_counts
    WHERE minute > date_trunc('minute', now()) - interval '15 minutes'
      AND source = 'admission'
      AND project = ANY(%(ids)s::text[])
      AND outcome NOT IN ('admitted', 'replayed')
    GROUP BY project
) AS refused ON refused.project = chosen.id
ORDER BY chosen.position
