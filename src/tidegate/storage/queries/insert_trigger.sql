INSERT INTO triggers (project, name, token, mode, task, secret, max_body_bytes,
                      sync_timeout_seconds, enabled, forward_url, forward_method,
                      forward_headers, forward_timeout_seconds, forward_secret, breaker_key,
                      unique_period, unique_args, unique_states, key_from)
VALUES (%(project)s, %(name)s, %(token)s, %(mode)s, %(task)s, %(secret)s,
        coalesce(%(max_body_bytes)s::integer, 1048576),
        coalesce(%(sync_timeout_seconds)s::float8, 30), coalesce(%(enabled)s::boolean, true),
        %(forward_url)s, coalesce(%(forward_method)s, 'POST'),
        coalesce(%(forward_headers)s::text[], '{}'),
        coalesce(%(forward_timeout_seconds)s::float8, 10), %(forward_secret)s, %(breaker_key)s,
        %(unique_period)s::float8, %(unique_args)s::text[], %(unique_states)s::run_state[],
        %(key_from)s::text)
RETURNING *
