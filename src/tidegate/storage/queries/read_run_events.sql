-- A page of a run's progress events after the one a reader has seen (its Last-Event-ID),
-- in order (run_events' primary key). The data stays JSON text: it goes out as it is.
SELECT id, attempt, at, data::text AS data
FROM run_events
WHERE run_id = %(run_id)s AND id > %(after)s
ORDER BY id
LIMIT %(limit)s
