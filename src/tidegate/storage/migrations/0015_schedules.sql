-- Schedules: runs made on a cron expression or a fixed interval, exactly one per tick.
-- Every worker looks for due schedules (lock_due_schedules); the one that locks a
-- schedule's row inserts the runs of its due ticks and moves next_tick past now in the
-- same transaction, so no two workers make a run for the same tick, and a worker that
-- dies half way leaves nothing behind (the next one redoes the whole tick).
CREATE TABLE schedules (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project          text        NOT NULL,
    name             text        NOT NULL,
    task             text        NOT NULL,
    args             jsonb       NOT NULL DEFAULT '{}',
    -- NULL: as the task says (its lane, key function, priority, max_attempts), resolved
    -- by a worker that has the task, like an enqueue of that worker's app.
    lane             text,
    key              text,
    priority         smallint,
    max_attempts     smallint,
    -- One of the two: a cron expression read in timezone, or seconds between ticks.
    cron             text,
    interval_seconds float8,
    timezone         text        NOT NULL DEFAULT 'UTC',
    -- After downtime: 'all' missed ticks (the newest catch_up_limit of them), 'once'
    -- (the newest), or 'skip' (none; a tick more than a minute late is missed).
    catch_up         text        NOT NULL DEFAULT 'once',
    catch_up_limit   integer     NOT NULL DEFAULT 100,
    -- While its last run has not finished: 'allow' another run, or 'skip' the tick.
    overlap          text        NOT NULL DEFAULT 'allow',
    declared         boolean     NOT NULL DEFAULT false,  -- by @app.periodic, in code
    paused           boolean     NOT NULL DEFAULT false,
    next_tick        timestamptz NOT NULL,
    last_tick        timestamptz,             -- the newest tick that made a run
    last_run_id      bigint,                  -- that run (it may have been pruned since)
    missed_ticks     bigint      NOT NULL DEFAULT 0,  -- passed over: catch-up or overlap
    last_error       text,                    -- why the last tick made no run, if it failed
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_name_unique UNIQUE (project, name),
    CONSTRAINT schedules_one_spec CHECK ((cron IS NULL) <> (interval_seconds IS NULL)),
    CONSTRAINT schedules_interval_range CHECK (interval_seconds BETWEEN 1 AND 315360000),
    CONSTRAINT schedules_catch_up_policy CHECK (catch_up IN ('all', 'once', 'skip')),
    CONSTRAINT schedules_overlap_policy CHECK (overlap IN ('allow', 'skip')),
    CONSTRAINT schedules_catch_up_limit_range CHECK (catch_up_limit BETWEEN 1 AND 10000),
    CONSTRAINT schedules_priority_range CHECK (priority BETWEEN 0 AND 9),
    CONSTRAINT schedules_max_attempts_range CHECK (max_attempts BETWEEN 1 AND 1000)
);

-- What the workers look for each second: the due ones, soonest first.
CREATE INDEX schedules_due ON schedules (next_tick) WHERE NOT paused;
