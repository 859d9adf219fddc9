-- The worker tokens by name, with how many live workers registered with each, a page
-- at a time: after the keyset %(after)s (the last name of the page before), at most
-- %(limit)s (NULL: all).
SELECT t.name, t.lanes, t.created_at,
       (SELECT count(*) FROM workers w
        WHERE w.token = t.name
          AND w.heartbeat_at > now() - make_interval(secs => %(live_seconds)s::float8)) AS live
FROM worker_tokens t
WHERE %(after)s::text IS NULL OR t.name > %(after)s
ORDER BY t.name
LIMIT %(limit)s::integer
