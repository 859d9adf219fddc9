-- Change the fields named in the patch (a JSON object); a JSON null clears the secret.
UPDATE triggers SET
    mode = coalesce(%(patch)s::jsonb ->> 'mode', mode),
    task = coalesce(%(patch)s::jsonb ->> 'task', task),
    secret = CASE WHEN %(patch)s::jsonb ? 'secret' THEN %(patch)s::jsonb ->> 'secret' ELSE secret END,
    max_body_bytes = coalesce((%(patch)s::jsonb ->> 'max_body_bytes')::integer, max_body_bytes),
    sync_timeout_seconds = coalesce((%(patch)s::jsonb ->> 'sync_timeout_seconds')::float8,
                                    sync_timeout_seconds),
    enabled = coalesce((%(patch)s::jsonb ->> 'enabled')::boolean, enabled),
    updated_at = now()
WHERE id = %(id)s
RETURNING *
