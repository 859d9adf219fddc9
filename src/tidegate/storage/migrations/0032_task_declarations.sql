-- Task settings known to every process: each worker declares its tasks when it starts
-- (schema.sql says why each column).
CREATE TABLE tasks (
    name            text        PRIMARY KEY,
    lane            text        NOT NULL,
    max_attempts    smallint,
    timeout_seconds float8,
    priority        smallint    NOT NULL,
    key_function    text,
    declared_by     text        NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tasks_name_length CHECK (length(name) BETWEEN 1 AND 255),
    CONSTRAINT tasks_lane_format CHECK (lane ~ '^[A-Za-z0-9_]{1,64}$'),
    CONSTRAINT tasks_priority_range CHECK (priority BETWEEN 0 AND 9),
    CONSTRAINT tasks_max_attempts_range CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT tasks_timeout_seconds_range CHECK (
        timeout_seconds > 0 AND timeout_seconds <= 315360000
    )
);
