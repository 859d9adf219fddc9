-- A page of a trigger's webhook log, newest first: admitted requests (requests) and
-- the others (request_log: refused, or a repeat answered with the original run),
-- merged. Each source is one ordered scan of its (trigger_id, received_at, id) index,
-- LIMITed, from the keyset (received_at, kind, id) of the last row of the page before;
-- the union is sorted and cut to the page. Rows of one time go 'refused' before
-- 'admitted' (kind DESC), so the keyset reads, per source, as a row comparison on the
-- index's own columns (the index condition): after a refused row at time t every
-- admitted row of t is still to come (id below the largest bigint), and after an
-- admitted row none of the refused ones of t is (id below 0). A project (%(project)s not NULL) reads its
-- own rows only, whatever trigger id it names.
SELECT * FROM (
    (SELECT 'admitted' AS kind, requests.id, requests.received_at,
            'admitted' AS outcome, NULL::smallint AS status, '' AS detail,
            requests.idempotency_key, requests.run_id, runs.state::text AS run_state
     FROM requests
     LEFT JOIN runs ON runs.id = requests.run_id
     WHERE requests.trigger_id = %(trigger_id)s
       AND (%(project)s::text IS NULL OR requests.project = %(project)s)
       AND (%(before_at)s::timestamptz IS NULL
            OR (requests.received_at, requests.id) < (
                %(before_at)s::timestamptz,
                CASE WHEN %(before_kind)s::text = 'admitted' THEN %(before_id)s::bigint
                     ELSE 9223372036854775807 END))
     ORDER BY requests.received_at DESC, requests.id DESC
     LIMIT %(limit)s::integer)
    UNION ALL
    (SELECT 'refused', request_log.id, request_log.received_at,
            request_log.outcome, request_log.status, request_log.detail,
            request_log.idempotency_key, request_log.run_id, NULL
     FROM request_log
     WHERE request_log.trigger_id = %(trigger_id)s
       AND (%(project)s::text IS NULL OR request_log.project = %(project)s)
       AND (%(before_at)s::timestamptz IS NULL
            OR (request_log.received_at, request_log.id) < (
                %(before_at)s::timestamptz,
                CASE WHEN %(before_kind)s::text = 'refused' THEN %(before_id)s::bigint
                     ELSE 0 END))
     ORDER BY request_log.received_at DESC, request_log.id DESC
     LIMIT %(limit)s::integer)
) AS merged
ORDER BY received_at DESC, kind DESC, id DESC
LIMIT %(limit)s::integer
