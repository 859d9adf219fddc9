-- A page of a run's progress events after the one a reader has seen (its Last-Event-ID),
-- in order (run_events' primary key): at most %(limit)s events, and no more once they
-- hold %(max_bytes)s bytes of data (the last may pass it; the first is always read). A
-- stream holds its page while a slow reader takes it: 100 events of 60 KiB were 6 MB,
-- and 500 slow readers 2.4 GB of the API's memory.
-- One probe of the primary key per event, in turn, so that the read stops at the bound:
-- a range scan with a running sum would read (and detoast) all %(limit)s events to keep
-- a few (100 small events: 0.39 ms, against 0.09 for the range scan). The data stays
-- JSON text: it goes out as it is. upto: the bytes of data up to the event, included.
WITH RECURSIVE page AS (
    (
        SELECT id, attempt, at, data, octet_length(data) AS upto, 1 AS n
        FROM (
            SELECT id, attempt, at, data::text AS data FROM run_events
            WHERE run_id = %(run_id)s AND id > %(after)s
            ORDER BY id
            LIMIT 1
        ) AS first
    )
    UNION ALL
    SELECT next.id, next.attempt, next.at, next.data, page.upto + octet_length(next.data),
           page.n + 1
    FROM page
    CROSS JOIN LATERAL (
        SELECT id, attempt, at, data::text AS data FROM run_events
        WHERE run_id = %(run_id)s AND id > page.id
        ORDER BY id
        LIMIT 1
    ) AS next
    WHERE page.upto < %(max_bytes)s AND page.n < %(limit)s
)
SELECT id, attempt, at, data, upto FROM page ORDER BY id
