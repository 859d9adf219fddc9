-- Keep the newest `size` entries of each trigger's webhook log (request_log_trigger):
-- the entry `size` places down each trigger's log, then everything as old or older.
DELETE FROM request_log AS r
USING (
    SELECT t.id AS trigger_id, cut.received_at, cut.id
    FROM unnest(%(trigger_ids)s::bigint[]) AS t(id)
    CROSS JOIN LATERAL (
        SELECT received_at, id FROM request_log
        WHERE request_log.trigger_id = t.id
        ORDER BY received_at DESC, id DESC
        OFFSET %(size)s
        LIMIT 1
    ) AS cut
) AS oldest_gone
WHERE r.trigger_id = oldest_gone.trigger_id
  AND (r.received_at, r.id) <= (oldest_gone.received_at, oldest_gone.id)
