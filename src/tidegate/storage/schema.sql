-- tidegate's tables as they are today: what a fresh schema is made of (migrate.py runs
-- this file, then the functions, and records every shipped migration as applied). The
-- stored functions, the aggregate and the trigger live in functions/, one file each.
--
-- A change to a table is a new migration (migrations/NNNN_name.sql) and the same change
-- here; test_migrations checks that a schema built from this file and one migrated from
-- 0001 are the same.

-- Runs ----------------------------------------------------------------------------------

CREATE TYPE run_state AS ENUM (
    'scheduled',   -- waiting for scheduled_at (delayed, or backing off after a failed attempt)
    'available',   -- ready to be claimed
    -- Of a task no live worker has: out of the claim's indexes until a worker that has the
    -- task starts (stage_runs.sql makes them available again). So a run of a task nobody
    -- has spends no attempt, and a backlog of them costs a claim a bounded scan once, not
    -- at every claim.
    'pending',
    'running',     -- claimed by worker_id until lease_expires_at
    'succeeded',
    'discarded',   -- failed its last attempt, or was rescued with no attempt left
    'cancelled'
);

CREATE TABLE runs (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
    -- The workloop (its index in the worker's spec) that claimed the run: the cluster's
    -- free fast-lane slots are counted from running runs, not from a busy counter.
    workloop         smallint,
    -- Where the run stands on its key's fair clock (start-time fair queuing): stamped at
    -- enqueue, and again when a delayed or retried run comes due, with
    --     vtime = key_clock(lane, key) + n / weight
    -- (functions/key_clock.sql). Claims take runs in (rank, id) order. A hot key's
    -- backlog spreads far into the virtual future; a cold key's next run lands at the
    -- clock, next in line. Every writer stamps it in its insert (insert_run.sql,
    -- insert_runs.sql, admit_webhook, stage_runs.sql, retry_run.sql): no trigger fires
    -- per row.
    vtime            float8      NOT NULL DEFAULT 0,
    -- Priority is an offset on the same clock: the clock passes a low-priority run in
    -- time, so nothing waits forever. The clock itself is read from vtime, not rank: in a
    -- lane whose runs all have priority 5 a cold key is still next in line.
    rank             float8      GENERATED ALWAYS AS (vtime + priority * 64) STORED,
    -- Whether the claim took the run as a half-open breaker's probe: the probes in flight
    -- are counted from the runs (a finished or rescued probe frees its place by leaving
    -- 'running'), and a probe's outcome, not an older run's, decides. Every claim sets it.
    probe            boolean     NOT NULL DEFAULT false,
    -- Set by a reader of the run's events while the run has not finished: its final
    -- transition then NOTIFYs the completed channel as a fast-lane run's does. Written on
    -- the run's row (not in a table of watchers) so that the reader's update and the
    -- run's last transition are ordered by the row's lock: whichever comes second sees
    -- the other.
    watched          boolean     NOT NULL DEFAULT false,
    -- A unique run's key (tidegate.app.Unique: a digest of its project, task and the
    -- fields the caller named, and of its period's window) and the states in which it
    -- holds the key: while such a run exists, an enqueue with the same key returns it
    -- instead of inserting (runs_unique). NULL for every other run.
    unique_key       text,
    unique_states    run_state[],
    -- The trace context of what made the run (tidegate.tracing): the W3C `traceparent`
    -- and `tracestate` of the enqueue's span, or of a webhook's sender. NULL where there
    -- was none.
    trace_context    jsonb,
    in_line          boolean,  -- its key was ordered when it was enqueued (runs_key_line)
    CONSTRAINT runs_lane_format CHECK (lane ~ '^[A-Za-z0-9_]+$'),
    CONSTRAINT runs_priority_range CHECK (priority BETWEEN 0 AND 9),
    CONSTRAINT runs_max_attempts_positive CHECK (max_attempts >= 1)
);

-- A ready run is in three indexes, and no more: runs_pkey, runs_claim_lane and
-- runs_key_ready (and runs_key_line, only for a key whose policy is ordered). Every
-- other index holds runs in other states, and is written by the transition into them
-- (docs/architecture.md, "Storage").
--
-- The claim: one ordered probe per lane of the chain, `*` included (its lanes found by a
-- skip scan of this index, functions/ready_lanes.sql); the lane's floor, its first entry
-- (key_clock); the metrics' ready runs per lane (lane_figures). No index across lanes:
-- every entry would land in one shared order, where runs of lanes whose ranks interleave
-- write to another leaf each (a burst of full-page images after each checkpoint).
CREATE INDEX runs_claim_lane ON runs (lane, rank, id) WHERE state = 'available';

-- A key's newest ready run: where its next run's virtual time starts (key_clock), and
-- the backlog cap's count of a key's ready runs (unstarted_runs_of_key).
CREATE INDEX runs_key_ready ON runs (lane, key, vtime) WHERE state = 'available';

-- The stager: scheduled runs that have come due.
CREATE INDEX runs_due ON runs (scheduled_at) WHERE state = 'scheduled';

-- The stager of a worker that has a task: its pending runs.
CREATE INDEX runs_pending ON runs (task) WHERE state = 'pending';

-- Runs in flight: a few per worker slot. The rescuer scans it for leases that ran out;
-- max_running, breaker probes and project concurrency count a key's (or a project's)
-- runs in flight from it, the ground truth of those limits, counted under an advisory
-- lock, never kept in a counter; fairness reads a lane's frontier from it
-- (lane_frontier); the run lists read a project's runs in flight from it (or from
-- runs_held below, which holds the same runs by worker). (lane, key):
-- a key's runs in flight are read from the key's own entries, not all its lane's (with
-- four workers of 32 slots, 128 rows per candidate of a claim with limits: 2.4-3.0 ms
-- per 32-run claim with max_running set, 1.7-1.8 ms with the key). One small index for
-- all keeps a claim's index writes few.
CREATE INDEX runs_running ON runs (lane, key) WHERE state = 'running';

-- A worker's runs in flight, from its own entries: a batch of outcomes finds its runs
-- among them (complete_runs, every worker's), a remote workloop's are counted under its
-- lock at each claim (held_runs), and the sync admission sums the fast lane's workloops'
-- free slots (admit_webhook). Through runs_running each read every run in flight of the
-- cluster, and every entry a finished run left there until a vacuum (a bitmap scan does
-- not mark them dead): a drain of 20,000 runs by four local workers read 2.8 million
-- entries in its 600 batches of outcomes (130,000 from this index), and a remote claim's
-- count took 0.8-1.3 ms (0.1 ms). It costs one entry per claimed run.
CREATE INDEX runs_held ON runs (worker_id, workloop) WHERE state = 'running';

-- A key's line, for a key whose policy is ordered: its earliest run not yet started (due,
-- delayed or backing off after a failed attempt, or waiting for a worker with its task),
-- found by one probe whatever its backlog, with runs_running for the one in flight
-- (claim_runs_keyed). Ordered by id, which no index of ready runs is: runs_key_ready
-- follows the fair clock, and a run that comes due again (a retry after its backoff) is
-- stamped behind its key's newer runs there, so the clock's order cannot tell a key's
-- head. Only the runs of ordered keys are in it (in_line, stamped by the insert from the
-- key's policy, and on a key's unfinished runs when its policy becomes ordered:
-- line_up_runs.sql): a run of any other key pays no fourth index entry.
CREATE INDEX runs_key_line ON runs (lane, key, id)
    WHERE in_line AND state IN ('scheduled', 'available', 'pending');

-- The pruner: finished runs by age.
CREATE INDEX runs_finished ON runs (completed_at)
    WHERE state IN ('succeeded', 'discarded', 'cancelled');

-- A duplicate enqueue returns the original run for as long as it is retained.
CREATE UNIQUE INDEX runs_idempotency ON runs (project, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Unique runs: one run per unique key among the runs in the states it names. The states
-- are the run's own (unique_states), so a run that moves to a state outside them (by
-- default: discarded, cancelled) frees its key by that same write. Only runs with a key
-- have an entry, and only their inserts go through ON CONFLICT (insert_runs.sql).
CREATE UNIQUE INDEX runs_unique ON runs (unique_key)
    WHERE unique_key IS NOT NULL AND state = ANY (unique_states);

-- The fast-lane cap: a project's in-flight fast-lane runs, counted up to the cap
-- (admit_webhook). Pending runs count too: they are in flight until they finish.
CREATE INDEX runs_fast_lane_inflight ON runs (project)
    WHERE lane = 'fast_lane' AND state IN ('scheduled', 'available', 'pending', 'running');

-- Retry-After: how long a project's recent fast-lane runs took.
CREATE INDEX runs_fast_lane_finished ON runs (project, completed_at)
    WHERE lane = 'fast_lane' AND state IN ('succeeded', 'discarded', 'cancelled');

-- The dashboard's run list (list_runs_page.sql), newest first, 50 at a time. Measured
-- at 1,000,000 runs (bench/run_list.py, docs/dashboard.md): with no filter, or a filter
-- that many runs match, a backward scan of the primary key finds a page in a few
-- milliseconds; a filter that matches few runs reads the whole table (90-250 ms). Two
-- filters are worth an index; each index is one more entry to write per run. Not
-- indexed: a rare task, key or lane alone (100-250 ms); runs_key_ready and the state
-- indexes serve them with a state filter, and an index each would cost every enqueue
-- for searches an operator makes now and then.
--
-- A project's runs at rest (scheduled, pending, finished): every list a project's
-- session shows is filtered by its project, and a small project among large ones was a
-- full scan (164 ms for 20 runs in a million). Not the ready runs nor those in flight:
-- an update that changes `state` (in the predicates of the partial indexes) is never
-- HOT, so it writes an entry in every index whose predicate the new row meets, and with
-- them this index took an entry at enqueue and at the claim, the two statements the
-- throughput is made of. Runs in flight are at most the workers' slots (the run lists
-- read a project's from runs_running); ready runs are read through the claim's indexes,
-- a scan of the ready runs for a project's list (list_runs.sql, list_runs_page.sql):
-- measured in docs/dashboard.md.
CREATE INDEX runs_project ON runs (project, id) WHERE state NOT IN ('available', 'running');

-- Failed and cancelled runs, what the list is most often filtered for: when all is well
-- there are few, and `state = 'discarded'` was a full scan (79 ms for none). An entry
-- only when a run ends so, never at enqueue.
CREATE INDEX runs_failed ON runs (id) WHERE state IN ('discarded', 'cancelled');

-- Where the table holds one lane, ANALYZE finds one distinct value and the planner
-- expects `lane = $1` to match every row: the probe of an empty named lane is costed as
-- a read of the whole backlog (it once took an index across lanes instead, and filtered
-- it). A fixed estimate of many lanes keeps each lane's probe costed as one lane's.
ALTER TABLE runs ALTER COLUMN lane SET (n_distinct = 100);

-- How runs spread over (lane, state) together. Without it the planner multiplies the two
-- columns' frequencies, as if independent: on a table of 900,000 succeeded runs in
-- `default` and 25,000 ready ones in each of four lanes, it took `default` to hold
-- 0.9 x 0.1 of the table ready. estimate_runs reads what it knows.
CREATE STATISTICS runs_lane_state (mcv) ON lane, state FROM runs;

-- Live progress: what a handler reports while its run executes (run.progress), read by
-- GET /runs/{id}/events and by a sync webhook's caller that asks for server-sent events.
-- The id orders a run's events (one worker writes them, in order, and only while it
-- holds the run) and is the SSE event id a client resumes from.
CREATE TABLE run_events (
    id      bigint      GENERATED ALWAYS AS IDENTITY,
    run_id  bigint      NOT NULL,
    attempt smallint    NOT NULL,
    at      timestamptz NOT NULL DEFAULT now(),
    data    jsonb       NOT NULL,
    PRIMARY KEY (run_id, id)
);

-- Workers --------------------------------------------------------------------------------

-- The workers that advertise capacity, local ones and remote ones (which reach the API
-- over HTTP): admission counts their fast-lane slots from here.
CREATE TABLE workers (
    id           text        PRIMARY KEY,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    -- [{"chain": ["manual", "*"], "slots": 4, "busy": 1}, ...]
    workloops    jsonb       NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    -- The tasks it has: a worker claims only runs of its tasks, and a run of a task no
    -- live worker has waits in 'pending' (docs/guarantees.md).
    tasks        text[]      NOT NULL DEFAULT '{}',
    -- The token a remote worker registered with (its name); NULL for a local worker.
    token        text,
    -- A workloop has 1 to 10,000 slots (tidegate.limits.MAX_SLOTS, checked where a spec
    -- is parsed): admission reads each live workloop's slots as an integer and sums them,
    -- so every reader may take the bound for granted, whoever wrote the row.
    CONSTRAINT workers_slots_bounded CHECK (
        NOT jsonb_path_exists(
            workloops,
            '$[*] ? (!exists(@.slots) || @.slots.type() != "number"
                     || @.slots < 1 || @.slots > 10000 || @.slots != @.slots.floor())'
        )
    )
);

-- The tasks the workers have, with the settings their code gives them: each worker
-- writes its tasks' rows when it starts (declare_tasks.sql; a remote one through the
-- API when it registers), so that a run enqueued by task name by a process that does
-- not have the task's code (the CLI, POST /runs, a webhook trigger, another service)
-- gets the same lane, priority and max_attempts as one enqueued by the app that has it.
-- The last worker to start wins; it logs the settings it replaced.
CREATE TABLE tasks (
    name            text        PRIMARY KEY,
    lane            text        NOT NULL,
    -- NULL: the enqueuer's default (TIDEGATE_MAX_ATTEMPTS), as for the app's own enqueue.
    max_attempts    smallint,
    -- Seconds an attempt may take (NULL: no limit). The worker that runs an attempt
    -- applies its own task's; the column says what the fleet declared.
    timeout_seconds float8,
    priority        smallint    NOT NULL,
    -- The name of the function that computes a run's key from its args, when the task
    -- has one: code that only the worker's app holds. A run enqueued by name elsewhere
    -- without a key gets its project's (app.resolve warns of it).
    key_function    text,
    declared_by     text        NOT NULL,   -- the worker that wrote the row
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tasks_name_length CHECK (length(name) BETWEEN 1 AND 255),
    CONSTRAINT tasks_lane_format CHECK (lane ~ '^[A-Za-z0-9_]{1,64}$'),
    -- The ranges of tidegate.limits.TASK_BOUNDS (tests/test_bounds.py checks them).
    CONSTRAINT tasks_priority_range CHECK (priority BETWEEN 0 AND 9),
    CONSTRAINT tasks_max_attempts_range CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT tasks_timeout_seconds_range CHECK (
        timeout_seconds > 0 AND timeout_seconds <= 315360000
    )
);

-- Remote workers' tokens (docs/workers.md). The admin gives each fleet a token scoped to
-- lanes; the API registers its workers in the workers table as local ones are, and
-- claims, renews and completes for them with the same statements.
CREATE TABLE worker_tokens (
    name       text        PRIMARY KEY,
    token_hash text        NOT NULL UNIQUE,   -- sha256 of the token, never the token
    -- The lanes its workers may claim from; '*' among them: any lane.
    lanes      text[]      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT worker_tokens_name_format CHECK (name ~ '^[A-Za-z0-9_.-]{1,64}$'),
    CONSTRAINT worker_tokens_some_lane CHECK (cardinality(lanes) BETWEEN 1 AND 64)
);

-- Projects, triggers and requests: what admission control reads ------------------------

CREATE TABLE projects (
    id             text        PRIMARY KEY,
    fast_lane_cap  integer,           -- in-flight fast-lane runs; NULL: the server default
    concurrency    integer,           -- in-flight runs per project outside fast_lane
    ingest_rate    float8,            -- webhooks per second; NULL: unlimited
    ingest_burst   integer     NOT NULL DEFAULT 1,
    backlog_cap    integer,           -- runs not started per lane and key; NULL: unlimited
    token_hash     text,              -- sha256 of the project's API token
    ingest_tat     timestamptz,       -- the ingest rate's state (GCRA: theoretical arrival)
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT projects_id_format CHECK (id ~ '^[A-Za-z0-9_.-]{1,64}$'),
    -- The ranges of tidegate.limits.PROJECT_BOUNDS, held by the database too (an integer
    -- column's type is its upper end; tests/test_bounds.py checks that they agree): 1/rate
    -- becomes an interval in every admission, and a value past them (a rate of 1e-20
    -- overflows make_interval) would fail every admission of the project.
    CONSTRAINT projects_fast_lane_cap_range CHECK (fast_lane_cap >= 0),
    CONSTRAINT projects_concurrency_range CHECK (concurrency >= 1),
    CONSTRAINT projects_ingest_rate_range CHECK (ingest_rate BETWEEN 0.001 AND 1000000),
    CONSTRAINT projects_ingest_burst_range CHECK (ingest_burst >= 1),
    CONSTRAINT projects_backlog_cap_range CHECK (backlog_cap >= 0)
);

-- A project token authenticates calls to the runs API for that project only.
CREATE UNIQUE INDEX projects_token ON projects (token_hash);

-- Whether any project has a concurrency limit, in one probe however many projects.
CREATE INDEX projects_with_concurrency ON projects (id) WHERE concurrency IS NOT NULL;

CREATE TABLE triggers (
    id                      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project                 text        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name                    text        NOT NULL,
    token                   text        NOT NULL UNIQUE,
    mode                    text        NOT NULL,
    task                    text        NOT NULL,
    secret                  text,
    max_body_bytes          integer     NOT NULL DEFAULT 1048576,
    sync_timeout_seconds    float8      NOT NULL DEFAULT 30,
    enabled                 boolean     NOT NULL DEFAULT true,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    -- Forwarding: a trigger that names a URL hands each webhook it admits to the
    -- built-in task tidegate.forward, which sends the request as received to that URL
    -- (forward.py). Its runs are keyed by breaker_key (the destination), so that one
    -- dead endpoint's breaker holds back only its own runs.
    forward_url             text,
    forward_method          text        NOT NULL DEFAULT 'POST',
    forward_headers         text[]      NOT NULL DEFAULT '{}',
    forward_timeout_seconds float8      NOT NULL DEFAULT 10,
    forward_secret          text,
    breaker_key             text,
    -- Unique webhooks (tidegate.webhooks.Trigger.unique): with a period, a webhook
    -- whose run would be like one holding its key (a run of the same trigger, with the
    -- same unique_args of the body, or the whole body when NULL, in the same window of
    -- unique_period seconds) makes no run and is answered with that one. unique_states:
    -- the states a run holds its key in (NULL: tidegate.unique's default). The key is the
    -- runs' (runs.unique_key, runs_unique): the database decides, as for an enqueue.
    unique_period           float8,
    unique_args             text[],
    unique_states           run_state[],
    -- Runs keyed from the webhook (tidegate.webhooks.KeyFrom): a JSON pointer into the
    -- body (/data/order/id) or a header (header:X-Shop-Domain) that holds each run's
    -- key; NULL: the project's, or a forwarding trigger's breaker key. A webhook that
    -- carries no key there is refused 422 by the API process, before the admission.
    key_from                text,
    CONSTRAINT triggers_name_unique UNIQUE (project, name),
    CONSTRAINT triggers_mode_valid CHECK (mode IN ('async', 'sync')),
    -- The numbers' ranges are tidegate.limits.TRIGGER_BOUNDS (tests/test_bounds.py
    -- checks that they agree).
    CONSTRAINT triggers_max_body_range CHECK (max_body_bytes BETWEEN 1 AND 104857600),
    CONSTRAINT triggers_sync_timeout_range CHECK (sync_timeout_seconds BETWEEN 0.001 AND 3600),
    -- The same bounds as the admin API's, so that no other writer can store what the
    -- task could not send.
    CONSTRAINT triggers_forward_url_valid
        CHECK (forward_url ~* '^https?://\S+$' AND length(forward_url) <= 2048),
    CONSTRAINT triggers_forward_method_valid
        CHECK (forward_method IN ('POST', 'PUT', 'PATCH')),
    CONSTRAINT triggers_forward_headers_range
        CHECK (cardinality(forward_headers) <= 32),
    CONSTRAINT triggers_forward_timeout_range
        CHECK (forward_timeout_seconds BETWEEN 0.001 AND 300),
    CONSTRAINT triggers_breaker_key_range
        CHECK (length(breaker_key) BETWEEN 1 AND 255),
    -- A forwarding trigger's runs are the forwarding task's: any other handler would
    -- ignore the URL.
    CONSTRAINT triggers_forward_task
        CHECK (forward_url IS NULL OR task = 'tidegate.forward'),
    CONSTRAINT triggers_unique_period_range CHECK (unique_period BETWEEN 1 AND 31536000),
    CONSTRAINT triggers_unique_args_range CHECK (cardinality(unique_args) <= 32),
    -- Without a period a trigger's webhooks are not unique: nothing else may say how.
    CONSTRAINT triggers_unique_needs_period
        CHECK (unique_period IS NOT NULL OR (unique_args IS NULL AND unique_states IS NULL)),
    -- The same forms as KeyFrom.parse takes (tests/test_trigger_keys.py holds them to
    -- it): a pointer of 1 to 32 tokens, ~ only as ~0 or ~1; or a header's name (RFC 9110
    -- token, 1 to 64 characters) that is not a credential, which is never kept.
    CONSTRAINT triggers_key_from_valid CHECK (
        length(key_from) BETWEEN 1 AND 255
        AND (key_from ~ '^(/([^/~]|~[01])*){1,32}$'
             OR (key_from ~ '^header:[!#$%&''*+.^_`|~0-9A-Za-z-]{1,64}$'
                 AND lower(key_from) NOT IN ('header:authorization', 'header:cookie',
                                             'header:proxy-authorization')))),
    -- A forwarding trigger's runs are keyed by their destination, so that one dead
    -- endpoint's breaker holds back only its own runs: no other key may replace it.
    CONSTRAINT triggers_key_from_not_forwarding
        CHECK (key_from IS NULL OR forward_url IS NULL)
);

-- Admitted webhooks as they arrived, kept for audit and replay.
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

-- A repeat of an admitted request finds the original (and its run) here. Keys are
-- scoped per trigger: two senders may well use the same ids.
CREATE UNIQUE INDEX requests_idempotency ON requests (trigger_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The pruner: requests by age.
CREATE INDEX requests_received ON requests (received_at);

-- The webhook log of a trigger, newest first, with a keyset that stays fast however many
-- requests are kept.
CREATE INDEX requests_trigger ON requests (trigger_id, received_at, id);

-- The forwarding task finds the request it sends by its run: one lookup per attempt.
-- One more index entry per admitted webhook.
CREATE INDEX requests_run ON requests (run_id);

-- The webhook log's other half: requests to a known trigger that were answered without
-- a new run (refused, or a replay of an earlier one), kept for a while and at most
-- webhook_log_size per trigger; the body up to webhook_log_body_bytes. Admitted requests
-- are in `requests`.
CREATE TABLE request_log (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trigger_id      bigint      NOT NULL REFERENCES triggers (id) ON DELETE CASCADE,
    project         text        NOT NULL,
    outcome         text        NOT NULL,
    status          smallint    NOT NULL,
    detail          text        NOT NULL,  -- what the answer said (its problem's detail)
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

-- The waiting room: a place for each caller refused for a limit (a project's fast-lane
-- cap, its ingest rate, a key's backlog cap), in the order they were refused (id). A
-- caller that comes back with its ticket is admitted before any caller behind it: the
-- room a cap frees goes to the places first in line, and the ingest rate reserves an
-- instant for each place when it is given (admit_webhook, take_place).
-- A place lapses when its caller has not come back by lapses_at; nothing reads a lapsed
-- place, and the next refusal in its line deletes it.
CREATE TABLE waiting_places (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project    text        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    -- The limit the line waits for: 'fast_lane', 'ingest' or 'backlog'.
    waits_for  text        NOT NULL,
    -- The backlog's key ('' for the project's own limits).
    key        text        NOT NULL,
    -- What the caller holds (the Tidegate-Place field): random, so a forged one finds
    -- no place.
    ticket     uuid        NOT NULL DEFAULT gen_random_uuid(),
    -- A cap's place: when the caller was told to come back (Retry-After, whole
    -- seconds), the promise the places behind it are scheduled from. The ingest rate's:
    -- the instant the rate reserved for it, from which on its caller is admitted.
    due_at     timestamptz NOT NULL,
    lapses_at  timestamptz NOT NULL
);

-- A line, in order: the places ahead of a caller, counted up to the room there is.
CREATE INDEX waiting_places_line ON waiting_places (project, waits_for, key, id);

-- A caller's place, by the ticket it brings back. One ticket names at most one place a
-- line: a place of the ingest rate's line that came due is kept beside the places caps'
-- lines then give its caller (a backlog's line is per key), under the same ticket
-- (admit_webhook).
CREATE UNIQUE INDEX waiting_places_ticket ON waiting_places (ticket, waits_for, key);

-- The super admin's token (its sha256): configured (TIDEGATE_ADMIN_TOKEN) or generated.
CREATE TABLE admin_tokens (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    token_hash text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Dashboard sessions (/ui): the cookie holds a random id, the table its sha256, so a
-- session works on every API process and signing out ends it everywhere. A session
-- signed in with a project's token sees that project only (project NOT NULL); the super
-- admin's sees every project (project NULL).
CREATE TABLE ui_sessions (
    id_hash    text        PRIMARY KEY,
    project    text        REFERENCES projects (id) ON DELETE CASCADE,
    csrf_token text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    -- The sha256 of the token the session was opened with: it ends when that token, the
    -- project's or the super admin's, is rotated (queries/find_ui_session.sql).
    token_hash text        NOT NULL
);
CREATE INDEX ui_sessions_expires ON ui_sessions (expires_at);

-- Per-key limits, fairness and circuit breakers, enforced at claim time -----------------

-- A key's policy in a lane; key '*' is the lane's default. Each field left NULL falls
-- back to the lane's default, then to none (weight: 1, rate_burst: 1; the breaker's
-- defaults are count_breaker_outcomes'). A key has a breaker when breaker_failures or
-- breaker_ratio applies to it.
CREATE TABLE key_policies (
    lane        text    NOT NULL,
    key         text    NOT NULL,
    max_running integer,            -- runs of the key in flight in the lane
    weight      float8,             -- the key's share of claims
    rate        float8,             -- runs started per second
    rate_burst  integer,            -- starts at once above the rate
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- Open after this many failed attempts within the window...
    breaker_failures             integer,
    -- ...or when this share of the window's attempts failed, once it holds at least
    -- breaker_min_attempts (default 10).
    breaker_ratio                float8,
    breaker_min_attempts         integer,
    breaker_window_seconds       float8,  -- default 60
    breaker_cooldown_seconds     float8,  -- the first open period; default 30
    breaker_max_cooldown_seconds float8,  -- doubling stops here; default 600
    breaker_probes               integer, -- half-open: runs in flight; default 1
    -- The key's runs start one at a time, in the order of their ids: a run waits while an
    -- earlier one of the key has not finished for good (runs_key_line, claim_runs_keyed).
    ordered                      boolean,
    PRIMARY KEY (lane, key),
    -- The ranges of tidegate.limits.POLICY_BOUNDS, held by the database too (an integer
    -- column's type is its upper end; tests/test_bounds.py checks that they agree): 1/rate
    -- and 1/weight become intervals and clock steps in every claim, and a value past them
    -- (a rate of 1e-20 overflows make_interval) would fail every claim of its lane.
    CONSTRAINT key_policies_max_running_range CHECK (max_running >= 0),
    CONSTRAINT key_policies_weight_range CHECK (weight BETWEEN 0.001 AND 1000),
    CONSTRAINT key_policies_rate_range CHECK (rate BETWEEN 0.001 AND 1000000),
    CONSTRAINT key_policies_rate_burst_range CHECK (rate_burst >= 1),
    CONSTRAINT key_policies_breaker_failures_range CHECK (breaker_failures >= 1),
    CONSTRAINT key_policies_breaker_ratio_range CHECK (breaker_ratio BETWEEN 0.01 AND 1),
    CONSTRAINT key_policies_breaker_min_attempts_range CHECK (breaker_min_attempts >= 1),
    CONSTRAINT key_policies_breaker_window_range
        CHECK (breaker_window_seconds BETWEEN 0.1 AND 86400),
    CONSTRAINT key_policies_breaker_cooldown_range
        CHECK (breaker_cooldown_seconds BETWEEN 0.1 AND 86400),
    CONSTRAINT key_policies_breaker_max_cooldown_range
        CHECK (breaker_max_cooldown_seconds BETWEEN 0.1 AND 604800),
    CONSTRAINT key_policies_breaker_probes_range CHECK (breaker_probes BETWEEN 1 AND 1000)
);

-- Each key's rate state (GCRA: the theoretical arrival time of its next start), advanced
-- by the claim only for runs it takes; the row lock serializes claimers of the same key.
CREATE TABLE key_rates (
    lane text        NOT NULL,
    key  text        NOT NULL,
    tat  timestamptz NOT NULL,
    PRIMARY KEY (lane, key)
);

-- How far claiming has got in each lane where limits gate keys: the newest vtime a claim
-- took, written once per claim (never per enqueue). Without it, a gated key's backlog at
-- the head of the order would be the clock, and everything behind it (lane_frontier).
CREATE TABLE lane_clocks (
    lane     text   PRIMARY KEY,
    frontier float8 NOT NULL
);

-- The lanes an operator paused (tidegate.lanes.pause_lane): no claim takes a run of a
-- paused lane, on any worker, local or remote, until it is resumed; its runs wait, and
-- its sync webhooks are refused (admit_webhook, lane_paused). A row per paused lane, so
-- a claim pays one probe of this primary key per lane of its chain, never one per run
-- (claim_runs.sql, claim_runs_keyed). Durable: a pause outlives every process.
-- paused_by: the surface it came from (the admin API, the dashboard, the CLI and its
-- user); reason: the operator's words, shown where the pause is listed.
CREATE TABLE paused_lanes (
    lane      text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text        NOT NULL,
    reason    text,
    CONSTRAINT paused_lanes_lane_format CHECK (lane ~ '^[A-Za-z0-9_]{1,64}$'),
    CONSTRAINT paused_lanes_paused_by_length CHECK (length(paused_by) BETWEEN 1 AND 255),
    CONSTRAINT paused_lanes_reason_length CHECK (length(reason) BETWEEN 1 AND 255)
);

-- A circuit breaker's state: one row per key that has failed lately, is open, or is
-- forced; a healthy key under a failure-count policy writes nothing. Written by the
-- completion statement (count_breaker_outcomes) and by an admin (forced); the claim only
-- reads it. Half-open is not stored: it is an open breaker whose open_until has passed
-- (breaker_state).
CREATE TABLE key_breakers (
    lane              text        NOT NULL,
    key               text        NOT NULL,
    state             text        NOT NULL DEFAULT 'closed',
    forced            text,                     -- 'open' or 'closed': set by an admin
    window_started_at timestamptz NOT NULL DEFAULT now(),
    attempts          integer     NOT NULL DEFAULT 0,  -- counted in the window
    failures          integer     NOT NULL DEFAULT 0,
    opened_at         timestamptz,
    open_until        timestamptz,
    cooldown_seconds  float8,                   -- this open period's length
    trips             integer     NOT NULL DEFAULT 0,  -- times it opened
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (lane, key),
    CONSTRAINT key_breakers_state_valid CHECK (state IN ('closed', 'open')),
    CONSTRAINT key_breakers_forced_valid CHECK (forced IN ('open', 'closed'))
);

-- Schedules ------------------------------------------------------------------------------

-- Runs made on a cron expression or a fixed interval, exactly one per tick. Every worker
-- looks for due schedules (lock_due_schedules.sql); the one that locks a schedule's row
-- inserts the runs of its due ticks and moves next_tick past now in the same
-- transaction, so no two workers make a run for the same tick, and a worker that dies
-- half way leaves nothing behind (the next one redoes the whole tick).
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
    -- The ranges of tidegate.limits.SCHEDULE_BOUNDS (tests/test_bounds.py checks them).
    CONSTRAINT schedules_interval_range CHECK (interval_seconds BETWEEN 1 AND 315360000),
    CONSTRAINT schedules_catch_up_policy CHECK (catch_up IN ('all', 'once', 'skip')),
    CONSTRAINT schedules_overlap_policy CHECK (overlap IN ('allow', 'skip')),
    CONSTRAINT schedules_catch_up_limit_range CHECK (catch_up_limit BETWEEN 1 AND 10000),
    CONSTRAINT schedules_priority_range CHECK (priority BETWEEN 0 AND 9),
    CONSTRAINT schedules_max_attempts_range CHECK (max_attempts BETWEEN 1 AND 1000)
);

-- What the workers look for each second: the due ones, soonest first.
CREATE INDEX schedules_due ON schedules (next_tick) WHERE NOT paused;

-- Metrics and the dashboard's figures (docs/metrics.md, docs/dashboard.md) ----------------

-- Attempts finished, by (task, lane, outcome), for GET /metrics. A worker counts in
-- memory and adds what it counted since its last heartbeat to its own rows, in the
-- heartbeat's statement: a completion writes nothing, and no two workers write the same
-- row. The rows of a worker that stopped or died are folded into those of worker_id
-- 'retired' (fold_counters.sql), so the table holds a few rows per live worker and the
-- sums never go back.
CREATE TABLE worker_counters (
    worker_id text   NOT NULL,
    task      text   NOT NULL,
    lane      text   NOT NULL,
    -- succeeded, failed, retry_requested, discarded, cancelled, late (worker/counters.py)
    outcome   text   NOT NULL,
    attempts  bigint NOT NULL,
    -- The attempts' handler time, in seconds, in all.
    seconds   float8 NOT NULL,
    -- The attempts by handler time: one count per bucket of DURATION_BUCKETS, then one
    -- for longer (worker/counters.py); not cumulative. Summed by sum_buckets.
    buckets   bigint[] NOT NULL,
    PRIMARY KEY (worker_id, task, lane, outcome)
);

-- Webhooks answered, by (project, mode, outcome, status), with the time to answer: each
-- API process counts in memory and adds its counts here about once a second
-- (api/ledger.py), so no request writes a counter of its own. Rows are only ever
-- added to: the sums never go back, whatever process starts or stops.
CREATE TABLE ingress_counters (
    project  text     NOT NULL,  -- '' when the trigger is unknown
    mode     text     NOT NULL,  -- async, sync; '' when the trigger is unknown
    -- One of tidegate.admission's outcomes: the admission's verdicts (admitted,
    -- rate_limited, ...) and the answers without one (unknown_trigger, bad_signature, ...)
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

-- Counts per minute for the dashboard's charts: webhook answers by project and outcome
-- ('admission'), finished attempts by lane, task and outcome ('attempt', added by the
-- workers' heartbeats and the rescuer). Rows older than an hour are deleted by whoever
-- adds. The task is here, not read from the finished runs, so that the tasks page's
-- chart costs the hour's rows of this table (a few per task and minute) however many
-- runs finished in it.
CREATE TABLE minute_counts (
    minute  timestamptz NOT NULL,
    source  text        NOT NULL,
    project text        NOT NULL,  -- '' for attempts
    lane    text        NOT NULL,  -- '' for admissions
    outcome text        NOT NULL,
    count   bigint      NOT NULL,
    task    text        NOT NULL DEFAULT '',  -- '' for admissions
    CONSTRAINT minute_counts_pkey PRIMARY KEY (minute, source, project, lane, task, outcome)
);
