-- Runs, their states, and the worker rows that advertise capacity.

CREATE TYPE run_state AS ENUM (
    'scheduled',   -- waiting for scheduled_at (delayed, or backing off after a failed attempt)
    'available',   -- ready to be claimed
    'running',     -- claimed by worker_id until lease_expires_at
    'succeeded',
    'discarded',   -- failed its last attempt, or was rescued with no attempt left
    'cancelled'
);

CREATE TABLE runs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project          text        NOT NULL DEFAULT 'default',
    lane             text        NOT NULL DEFAULT 'default',
    key              text        NOT NULL,
    task             text        NOT NULL,
    args             jsonb       NOT NULL DEFAULT '{}',
    state            run_state   NOT NULL DEFAULT 'available',
    priority         smallint    NOT NULL DEFAULT 0,
    attempt          smallint    NOT NULL DEFAULT 0,
    max_attempts     smallint    NOT NULL DEFAULT 20,
    scheduled_at     timestamptz NOT NULL DEFAULT now(),
    inserted_at      timestamptz NOT NULL DEFAULT now(),
    attempted_at     timestamptz,
    completed_at     timestamptz,
    worker_id        text,
    lease_expires_at timestamptz,
    result           jsonb,
    errors           jsonb       NOT NULL DEFAULT '[]',
    idempotency_key  text,
    CONSTRAINT runs_lane_format CHECK (lane ~ '^[A-Za-z0-9_]+$'),
    CONSTRAINT runs_priority_range CHECK (priority BETWEEN 0 AND 9),
    CONSTRAINT runs_max_attempts_positive CHECK (max_attempts >= 1)
);

-- The claim of a named lane: one ordered probe per lane in the chain.
CREATE INDEX runs_claim_lane ON runs (lane, priority, scheduled_at, id)
    WHERE state = 'available';

-- The claim of `*` (every lane not named before it): one ordered probe across lanes.
CREATE INDEX runs_claim_any ON runs (priority, scheduled_at, id)
    WHERE state = 'available';

-- The stager: scheduled runs that have come due.
CREATE INDEX runs_due ON runs (scheduled_at) WHERE state = 'scheduled';

-- Runs in flight: a few per worker slot. The rescuer scans it for leases that ran out,
-- per-key and per-project limits count runs in flight from it, fairness reads a lane's
-- frontier from it (0003). One small index for all keeps a claim's index writes few.
CREATE INDEX runs_running ON runs (lane) WHERE state = 'running';

-- The pruner: finished runs by age.
CREATE INDEX runs_finished ON runs (completed_at)
    WHERE state IN ('succeeded', 'discarded', 'cancelled');

-- A duplicate enqueue returns the original run for as long as it is retained.
CREATE UNIQUE INDEX runs_idempotency ON runs (project, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE workers (
    id           text        PRIMARY KEY,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    -- [{"chain": ["manual", "*"], "slots": 4, "busy": 1}, ...]
    workloops    jsonb       NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);
