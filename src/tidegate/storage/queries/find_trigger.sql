-- The trigger a webhook names by its token (triggers_token_key).
SELECT id, project, name, mode, task, secret, max_body_bytes, sync_timeout_seconds, enabled,
       forward_url, breaker_key, unique_period, unique_args, unique_states::text[],
       key_from
FROM triggers WHERE token = %(token)s
