-- Projects, triggers and received requests; what admission control reads.

-- The workloop (its index in the worker's spec) that claimed a run: the cluster's
-- free fast-lane slots are counted from running runs, not from a busy counter.
ALTER TABLE runs ADD COLUMN workloop smallint;

CREATE TABLE projects (
    id             text        PRIMARY KEY,
    fast_lane_cap  integer,           -- in-flight fast-lane runs; NULL: the server default
    concurrency    integer,           -- in-flight runs per project outside fast_lane
    ingest_rate    float8,            -- webhooks per second; NULL: unlimited
    ingest_burst   integer     NOT NULL DEFAULT 1,
    backlog_cap    integer,           -- ready runs per lane; NULL: unlimited
    token_hash     text,              -- sha256 of the project's API token
    ingest_tat     timestamptz,       -- the ingest rate's state (GCRA: theoretical arrival)
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT projects_id_format CHECK (id ~ '^[A-Za-z0-9_.-]{1,64}$'),
    CONSTRAINT projects_fast_lane_cap_range CHECK (fast_lane_cap >= 0),
    CONSTRAINT projects_concurrency_range CHECK (concurrency >= 1),
    CONSTRAINT projects_ingest_rate_range CHECK (ingest_rate > 0),
    CONSTRAINT projects_ingest_burst_range CHECK (ingest_burst >= 1),
    CONSTRAINT projects_backlog_cap_range CHECK (backlog_cap >= 0)
);

CREATE TABLE triggers (
    id                   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project              text        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name                 text        NOT NULL,
    token                text        NOT NULL UNIQUE,
    mode                 text        NOT NULL,
    task                 text        NOT NULL,
    secret               text,
    max_body_bytes       integer     NOT NULL DEFAULT 1048576,
    sync_timeout_seconds float8      NOT NULL DEFAULT 30,
    enabled              boolean     NOT NULL DEFAULT true,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT triggers_name_unique UNIQUE (project, name),
    CONSTRAINT triggers_mode_valid CHECK (mode IN ('async', 'sync')),
    CONSTRAINT triggers_max_body_range CHECK (max_body_bytes BETWEEN 1 AND 104857600),
    CONSTRAINT triggers_sync_timeout_range CHECK (sync_timeout_seconds > 0)
);

CREATE TABLE requests (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project         text        NOT NULL,
    trigger_id      bigint      NOT NULL,
    run_id          bigint      NOT NULL,
    idempotency_key text,
    content_type    text,
    headers         jsonb       NOT NULL,
    body            bytea       NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now()
);

-- A repeat of an admitted request finds the original (and its run) here.
CREATE UNIQUE INDEX requests_idempotency ON requests (project, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX requests_received ON requests (received_at);

-- A project token authenticates calls to the runs API for that project only.
CREATE UNIQUE INDEX projects_token ON projects (token_hash);

-- The fast-lane cap: a project's in-flight fast-lane runs, counted up to the cap.
CREATE INDEX runs_fast_lane_inflight ON runs (project)
    WHERE lane = 'fast_lane' AND state IN ('scheduled', 'available', 'running');

-- Retry-After: how long a project's recent fast-lane runs took.
CREATE INDEX runs_fast_lane_finished ON runs (project, completed_at)
    WHERE lane = 'fast_lane' AND state IN ('succeeded', 'discarded', 'cancelled');

-- The super admin's token (its sha256), when it was generated rather than configured.
CREATE TABLE admin_tokens (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    token_hash text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
