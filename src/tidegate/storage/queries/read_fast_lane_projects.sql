-- The fast-lane figures of at most max_projects projects: the busiest by in-flight
-- fast-lane runs (scheduled, available, pending or running, as admission counts them),
-- then idle ones in name order to fill the rest. In-flight runs are read from
-- runs_fast_lane_inflight, at most scan_limit entries: admission keeps them near the
-- fast-lane slots of the cluster. Idle projects come from the primary key, at most
-- twice max_projects rows. A project's cap is its own, or default_cap.
WITH in_flight AS (
    SELECT project, count(*) AS runs FROM (
        SELECT project FROM runs
        WHERE lane = 'fast_lane' AND state IN ('scheduled', 'available', 'pending', 'running')
        LIMIT %(scan_limit)s::integer
    ) AS held
    GROUP BY project
),
busiest AS (
    SELECT project, runs FROM in_flight
    ORDER BY runs DESC, project
    LIMIT %(max_projects)s::integer
),
idle AS (
    SELECT id AS project, 0::bigint AS runs FROM projects
    WHERE id NOT IN (SELECT project FROM busiest)
    ORDER BY id
    LIMIT %(max_projects)s::integer - (SELECT count(*) FROM busiest)
)
SELECT chosen.project, chosen.runs,
       coalesce(projects.fast_lane_cap, %(default_cap)s::integer) AS cap
FROM (SELECT * FROM busiest UNION ALL SELECT * FROM idle) AS chosen
LEFT JOIN projects ON projects.id = chosen.project
ORDER BY chosen.runs DESC, chosen.project
