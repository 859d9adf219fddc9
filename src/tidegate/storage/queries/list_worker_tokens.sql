-- The worker tokens, with how many live workers registered with each.
SELECT t.name, t.lanes, t.created_at,
       (SELECT count(*) FROM workers w
        WHERE w.token = t.name
          AND w.heartbeat_at > now() - make_interval(secs => %(live_seconds)s::float8)) AS live
FROM worker_tokens t
ORDER BY t.name
