-- What /readyz needs in one round trip: the schema's version, and the live workers.
SELECT (SELECT coalesce(max(version), 0) FROM migrations) AS schema_version,
       (SELECT count(*) FROM workers
        WHERE heartbeat_at > now() - make_interval(secs => %(live_seconds)s::float8)) AS workers
