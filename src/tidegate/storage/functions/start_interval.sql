-- How often a key's runs in a lane start, as seconds between starts: the rate at which
-- its backlog frees room (admit_webhook's waiting room). From its last 20 starts up to
-- now, so that starts that stopped (no worker) make the interval grow; 5 s with none.
-- The starts read are the key's runs in flight (runs_running) and those among the last
-- 200 runs to finish (runs_finished, newest first): bounded whatever the other keys do,
-- on the refusal path only.
CREATE OR REPLACE FUNCTION start_interval(p_lane text, p_key text, p_project text)
RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT coalesce(extract(epoch FROM clock_timestamp() - min(started.attempted_at))::float8
                    / nullif(count(*), 0), 5)
    FROM (
        SELECT attempted_at FROM (
            (SELECT runs.attempted_at FROM runs
             WHERE runs.lane = p_lane AND runs.key = p_key AND runs.state = 'running'
               AND runs.project = p_project)
            UNION ALL
            (SELECT finished.attempted_at FROM (
                SELECT runs.attempted_at, runs.lane, runs.key, runs.project FROM runs
                WHERE runs.state IN ('succeeded', 'discarded', 'cancelled')
                ORDER BY runs.completed_at DESC
                LIMIT 200
             ) AS finished
             WHERE finished.lane = p_lane AND finished.key = p_key
               AND finished.project = p_project AND finished.attempted_at IS NOT NULL)
        ) AS recent
        ORDER BY attempted_at DESC
        LIMIT 20
    ) AS started
$$;
