-- What the API processes answered, minute by minute activity, and the webhook log of
-- requests that did not become a run (docs/metrics.md, docs/dashboard.md).

-- Webhooks answered, by (project, mode, outcome, status), with the time to answer:
-- each API process counts in memory and adds its counts here about once a second
-- (api/ledger.py), so no request writes a counter of its own. Rows are only
-- ever added to: the sums never go back, whatever process starts or stops.
CREATE TABLE ingress_counters (
    project  text     NOT NULL,  -- '' when the trigger is unknown
    mode     text     NOT NULL,  -- async, sync; '' when the trigger is unknown
    -- admitted, replayed, rate_limited, over_cap, no_worker, no_capacity, backlog_full,
    -- unknown_trigger, too_large, not_json, bad_json, bad_signature, bad_key, unavailable
    outcome  text     NOT NULL,
    status   smallint NOT NULL,
    requests bigint   NOT NULL,
    -- The time to answer, in seconds, in all; a sync admitted request's is its round
    -- trip, the run included.
    seconds  float8   NOT NULL,
    -- The requests by time to answer, one count per bucket of ANSWER_BUCKETS and one
    -- above (api/ledger.py); not cumulative.
    buckets  bigint[] NOT NULL,
    PRIMARY KEY (project, mode, outcome, status)
);

-- Counts per minute for the dashboard's charts: webhook answers by project and
-- outcome ('admission'), finished attempts by lane and outcome ('attempt', added by
-- the workers' heartbeats). Rows older than an hour are deleted by whoever adds.
CREATE TABLE minute_counts (
    minute  timestamptz NOT NULL,
    source  text        NOT NULL,
    project text        NOT NULL,  -- '' for attempts
    lane    text        NOT NULL,  -- '' for admissions
    outcome text        NOT NULL,
    count   bigint      NOT NULL,
    PRIMARY KEY (minute, source, project, lane, outcome)
);

-- The webhook log's other half: requests to a known trigger that were answered
-- without a new run (refused, or a replay of an earlier one), kept for a while and
-- at most webhook_log_size per trigger; the body up to webhook_log_body_bytes.
-- Admitted requests are in `requests`.
CREATE TABLE request_log (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trigger_id      bigint      NOT NULL REFERENCES triggers (id) ON DELETE CASCADE,
    project         text        NOT NULL,
    outcome         text        NOT NULL,
    status          smallint    NOT NULL,
    detail          text        NOT NULL,  -- what the answer said (its problem's title)
    run_id          bigint,                -- replayed: the run of the original request
    idempotency_key text,
    content_type    text,
    headers         jsonb       NOT NULL,
    body            bytea       NOT NULL,
    body_truncated  boolean     NOT NULL,
    received_at     timestamptz NOT NULL
);
CREATE INDEX request_log_trigger ON request_log (trigger_id, received_at, id);
CREATE INDEX request_log_received ON request_log (received_at);

-- The webhook log of a trigger, newest first, with a keyset that stays fast however
-- many requests are kept.
CREATE INDEX requests_trigger ON requests (trigger_id, received_at, id);

-- Dashboard sessions (/ui): the cookie holds a random id, the table its sha256, so a
-- session works on every API process and signing out ends it everywhere. A session
-- signed in with a project's token sees that project only (project NOT NULL); the
-- super admin's sees every project (project NULL).
CREATE TABLE ui_sessions (
    id_hash    text        PRIMARY KEY,
    project    text        REFERENCES projects (id) ON DELETE CASCADE,
    csrf_token text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX ui_sessions_expires ON ui_sessions (expires_at);
