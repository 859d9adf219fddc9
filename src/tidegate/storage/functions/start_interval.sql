-- How often a key's runs in a lane start, as seconds between starts: the rate at which
-- its backlog frees room (admit_webhook's waiting room). From its last 20 starts up to
-- now, so that starts that stopped (no worker) make the interval grow; 5 s with none.
-- The runs read are the key's running ones (runs_running) and the project's newest
-- others (runs_project), on the refusal path only.
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
            (SELECT runs.attempted_at FROM runs
             WHERE runs.project = p_project AND runs.state <> 'running'
               AND runs.lane = p_lane AND runs.key = p_key AND runs.attempted_at IS NOT NULL
             ORDER BY runs.id DESC
             LIMIT 20)
        ) AS recent
        ORDER BY attempted_at DESC
        LIMIT 20
    ) AS started
$$;
