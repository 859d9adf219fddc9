-- The request a forwarding run sends, and where its trigger sends it now (requests_run).
SELECT r.id AS request_id, r.content_type, r.headers, r.body,
       t.forward_url, t.forward_method, t.forward_headers, t.forward_timeout_seconds,
       t.forward_secret
FROM requests r
JOIN triggers t ON t.id = r.trigger_id
WHERE r.run_id = %(run_id)s
