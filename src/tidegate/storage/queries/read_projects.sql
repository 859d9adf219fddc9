-- The admission figures of the projects %(ids)s, in that order: the fast-lane cap (its
-- own, else %(default_cap)s) and the runs it counts (runs_fast_lane_inflight, at most
-- count_cap), the ingest rate and burst, the backlog cap, and the webhooks refused in
-- the last 15 minutes by the status they got. minute_counts holds outcomes, not
-- statuses: the caller names those answered 429 (%(refused_429)s) and 503
-- (%(refused_503)s) from their declaration (tidegate.admission), and those that made or
-- found a run (%(answered)s); the rest were refused with a 4xx. A project without a row
-- (runs enqueued from code go to 'default') shows the server's cap.
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
           sum(count) FILTER (WHERE outcome = ANY(%(refused_429)s::text[])) AS status_429,
           sum(count) FILTER (WHERE outcome = ANY(%(refused_503)s::text[])) AS status_503,
           sum(count) FILTER (
               WHERE outcome <> ALL(%(refused_429)s::text[] || %(refused_503)s::text[])
           ) AS status_4xx
    FROM minute_counts
    WHERE minute > date_trunc('minute', now()) - interval '15 minutes'
      AND source = 'admission'
      AND project = ANY(%(ids)s::text[])
      AND outcome <> ALL(%(answered)s::text[])
    GROUP BY project
) AS refused ON refused.project = chosen.id
ORDER BY chosen.position
