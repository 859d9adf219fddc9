-- One request of a trigger's webhook log, as it arrived: from requests (kind
-- 'admitted') or request_log (kind 'refused'), only if it is the trigger's, and the
-- project's when %(project)s is not NULL.
SELECT 'admitted' AS kind, id, received_at, 'admitted' AS outcome, NULL::smallint AS status,
       '' AS detail, run_id, idempotency_key, content_type, headers, body,
       false AS body_truncated
FROM requests
WHERE %(kind)s::text = 'admitted' AND id = %(id)s AND trigger_id = %(trigger_id)s
  AND (%(project)s::text IS NULL OR project = %(project)s)
UNION ALL
SELECT 'refused', id, received_at, outcome, status, detail, run_id, idempotency_key,
       content_type, headers, body, body_truncated
FROM request_log
WHERE %(kind)s::text = 'refused' AND id = %(id)s AND trigger_id = %(trigger_id)s
  AND (%(project)s::text IS NULL OR project = %(project)s)
