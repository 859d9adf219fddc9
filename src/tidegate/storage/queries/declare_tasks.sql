-- Write the settings of a worker's tasks as its code declares them, once, when it
-- starts (a remote worker's when it registers): the last worker to start wins.
-- The result is what the upsert replaced where it differed: the settings another worker
-- (declared_by) declared for the same name, for the warning a rolling deploy needs.
-- previous reads the rows as they were before this statement (a CTE's snapshot is the
-- statement's); ORDER BY name takes the rows' locks in one order, so two workers that
-- start at once never deadlock.
WITH declared AS (
    SELECT * FROM jsonb_to_recordset(%(tasks)s::jsonb) AS (
        name text, lane text, max_attempts smallint, timeout_seconds float8,
        priority smallint, key_function text
    )
),
previous AS (
    SELECT t.* FROM tasks t JOIN declared d ON d.name = t.name
),
written AS (
    INSERT INTO tasks AS t (name, lane, max_attempts, timeout_seconds, priority,
                            key_function, declared_by, updated_at)
    SELECT name, lane, max_attempts, timeout_seconds, priority, key_function,
           %(declared_by)s, now()
    FROM declared
    ORDER BY name
    ON CONFLICT (name) DO UPDATE
    SET lane = excluded.lane, max_attempts = excluded.max_attempts,
        timeout_seconds = excluded.timeout_seconds, priority = excluded.priority,
        key_function = excluded.key_function, declared_by = excluded.declared_by,
        updated_at = excluded.updated_at
)
SELECT p.name, p.lane, p.max_attempts, p.timeout_seconds, p.priority, p.key_function,
       p.declared_by, p.updated_at
FROM previous p JOIN declared d ON d.name = p.name
WHERE (p.lane, p.max_attempts, p.timeout_seconds, p.priority, p.key_function)
      IS DISTINCT FROM (d.lane, d.max_attempts, d.timeout_seconds, d.priority, d.key_function)
ORDER BY p.name
