-- The live workers (a heartbeat within live_seconds) and their workloops' slots
-- and busy slots, summed by chain (`manual>*`): one row per chain, or one row with a
-- NULL chain when no live worker has a workloop. Workers are few: a scan is cheap.
WITH live AS (
    SELECT workloops, heartbeat_at FROM workers
    WHERE heartbeat_at > now() - make_interval(secs => %(live_seconds)s::float8)
),
loops AS (
    SELECT (SELECT string_agg(link, '>' ORDER BY position)
            FROM jsonb_array_elements_text(loop -> 'chain') WITH ORDINALITY AS c(link, position)
           ) AS chain,
           sum((loop ->> 'slots')::bigint)::bigint AS slots,
           sum((loop ->> 'busy')::bigint)::bigint AS busy
    FROM live CROSS JOIN LATERAL jsonb_array_elements(live.workloops) AS l(loop)
    GROUP BY 1
)
SELECT summary.workers, summary.heartbeat_age_seconds, loops.chain, loops.slots, loops.busy
FROM (
    SELECT count(*) AS workers,
           coalesce(extract(epoch FROM now() - min(heartbeat_at)), 0)::float8
               AS heartbeat_age_seconds
    FROM live
) AS summary
LEFT JOIN loops ON true
ORDER BY loops.chain
