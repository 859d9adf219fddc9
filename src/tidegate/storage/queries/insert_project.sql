INSERT INTO projects (id, fast_lane_cap, concurrency, ingest_rate, ingest_burst, backlog_cap,
                      token_hash)
VALUES (%(id)s, %(fast_lane_cap)s, %(concurrency)s, %(ingest_rate)s,
        coalesce(%(ingest_burst)s::integer, 1), %(backlog_cap)s, %(token_hash)s)
RETURNING id, fast_lane_cap, concurrency, ingest_rate, ingest_burst, backlog_cap,
          created_at, updated_at
