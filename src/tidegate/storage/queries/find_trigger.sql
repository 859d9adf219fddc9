-- The trigger a webhook names by its token (triggers_token_key).
SELECT id, project, name, mode, task, secret, max_body_bytes, sync_timeout_seconds, enabled,
       forward_url, breaker_key
FROM triggers WHERE token = %(token)s
