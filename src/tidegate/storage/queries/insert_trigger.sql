INSERT INTO triggers (project, name, token, mode, task, secret, max_body_bytes,
                      sync_timeout_seconds, enabled)
VALUES (%(project)s, %(name)s, %(token)s, %(mode)s, %(task)s, %(secret)s,
        coalesce(%(max_body_bytes)s::integer, 1048576),
        coalesce(%(sync_timeout_seconds)s::float8, 30), coalesce(%(enabled)s::boolean, true))
RETURNING *
