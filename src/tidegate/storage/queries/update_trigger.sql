-- Change the fields named in the patch (a JSON object); a JSON null clears the secrets,
-- the forward URL, the breaker key, the unique fields and key_from.
UPDATE triggers SET
    mode = coalesce(%(patch)s::jsonb ->> 'mode', mode),
    task = coalesce(%(patch)s::jsonb ->> 'task', task),
    secret = CASE WHEN %(patch)s::jsonb ? 'secret' THEN %(patch)s::jsonb ->> 'secret' ELSE secret END,
    max_body_bytes = coalesce((%(patch)s::jsonb ->> 'max_body_bytes')::integer, max_body_bytes),
    sync_timeout_seconds = coalesce((%(patch)s::jsonb ->> 'sync_timeout_seconds')::float8,
                                    sync_timeout_seconds),
    enabled = coalesce((%(patch)s::jsonb ->> 'enabled')::boolean, enabled),
    forward_url = CASE WHEN %(patch)s::jsonb ? 'forward_url'
                       THEN %(patch)s::jsonb ->> 'forward_url' ELSE forward_url END,
    forward_method = coalesce(%(patch)s::jsonb ->> 'forward_method', forward_method),
    forward_headers = CASE WHEN jsonb_typeof(%(patch)s::jsonb -> 'forward_headers') = 'array'
                           THEN ARRAY(SELECT jsonb_array_elements_text(
                                          %(patch)s::jsonb -> 'forward_headers'))
                           ELSE forward_headers END,
    forward_timeout_seconds = coalesce((%(patch)s::jsonb ->> 'forward_timeout_seconds')::float8,
                                       forward_timeout_seconds),
    forward_secret = CASE WHEN %(patch)s::jsonb ? 'forward_secret'
                          THEN %(patch)s::jsonb ->> 'forward_secret' ELSE forward_secret END,
    breaker_key = CASE WHEN %(patch)s::jsonb ? 'breaker_key'
                       THEN %(patch)s::jsonb ->> 'breaker_key' ELSE breaker_key END,
    unique_period = CASE WHEN %(patch)s::jsonb ? 'unique_period'
                         THEN (%(patch)s::jsonb ->> 'unique_period')::float8
                         ELSE unique_period END,
    unique_args = CASE WHEN jsonb_typeof(%(patch)s::jsonb -> 'unique_args') = 'array'
                       THEN ARRAY(SELECT jsonb_array_elements_text(
                                      %(patch)s::jsonb -> 'unique_args'))
                       WHEN %(patch)s::jsonb ? 'unique_args' THEN NULL
                       ELSE unique_args END,
    unique_states = CASE WHEN jsonb_typeof(%(patch)s::jsonb -> 'unique_states') = 'array'
                         THEN ARRAY(SELECT jsonb_array_elements_text(
                                        %(patch)s::jsonb -> 'unique_states'))::run_state[]
                         WHEN %(patch)s::jsonb ? 'unique_states' THEN NULL
                         ELSE unique_states END,
    key_from = CASE WHEN %(patch)s::jsonb ? 'key_from'
                    THEN %(patch)s::jsonb ->> 'key_from' ELSE key_from END,
    updated_at = now()
WHERE id = %(id)s
RETURNING *
