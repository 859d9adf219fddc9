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

-- Admit one webhook, or say why not, in one round trip and one transaction.
--
-- Checks in order, the first that applies answers; a rejection inserts nothing:
--   replayed      a repeat of an admitted request (same idempotency key): the original
--                 run, before any limit. An advisory lock on the key serializes two
--                 copies arriving at once; the second then finds the first.
--   rate_limited  the project's ingest rate and burst (GCRA on projects.ingest_tat).
--   over_cap      fast lane: the project's in-flight fast-lane runs are at its cap.
--                 Counted from the runs themselves (runs_fast_lane_inflight, at most
--                 cap rows) under an advisory lock on the project held to commit, so
--                 two API processes can never both take the last place, and a finished
--                 run frees its place by finishing: there is no counter to drift.
--   no_capacity   fast lane: no live worker has a free slot that can take it.
--   backlog_full  the project's ready runs in the lane (its webhooks' key is the
--                 project) are at its backlog cap, counted up to the cap.
--   admitted      run and request inserted, the lane notified.
CREATE FUNCTION admit_webhook(
    p_trigger_id bigint,
    p_project text,
    p_lane text,
    p_task text,
    p_args jsonb,
    p_max_attempts smallint,
    p_idempotency_key text,
    p_content_type text,
    p_headers jsonb,
    p_body bytea,
    p_default_fast_lane_cap integer,
    p_live_seconds float8,
    p_channel text
) RETURNS TABLE (
    decision text,
    run_id bigint,
    request_id bigint,
    fast_lane_cap integer,
    fast_lane_remaining integer,
    ingest_burst integer,
    ingest_remaining integer,
    retry_after float8
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    proj projects%ROWTYPE;
    emission float8;
    tat timestamptz;
    cap integer;
    inflight integer;
    free_slots bigint;
    backlog integer;
    new_run bigint;
    new_request bigint;
BEGIN
    IF p_idempotency_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(
            hashtextextended('tidegate.request/' || p_project || '/' || p_idempotency_key, 0));
        RETURN QUERY
            SELECT 'replayed', r.run_id, r.id, NULL::integer, NULL::integer, NULL::integer,
                   NULL::integer, NULL::float8
            FROM requests r
            WHERE r.project = p_project AND r.idempotency_key = p_idempotency_key;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;

    SELECT * INTO proj FROM projects WHERE id = p_project;
    ingest_burst := proj.ingest_burst;

    IF proj.ingest_rate IS NOT NULL THEN
        -- The row lock serializes the project's admissions while the rate is decided;
        -- the new arrival time is written only if the request is admitted, so a
        -- rejection spends nothing.
        emission := 1.0 / proj.ingest_rate;
        SELECT greatest(coalesce(projects.ingest_tat, now()), now()) INTO tat
        FROM projects WHERE id = p_project FOR UPDATE;
        IF tat > now() + make_interval(secs => (proj.ingest_burst - 1) * emission) THEN
            RETURN QUERY SELECT 'rate_limited', NULL::bigint, NULL::bigint, NULL::integer,
                NULL::integer, proj.ingest_burst, 0,
                extract(epoch FROM tat - now())::float8 - (proj.ingest_burst - 1) * emission;
            RETURN;
        END IF;
        tat := tat + make_interval(secs => emission);
        ingest_remaining := greatest(0, floor(
            (proj.ingest_burst * emission - extract(epoch FROM tat - now())::float8) / emission
        )::integer);
    END IF;

    IF p_lane = 'fast_lane' THEN
        cap := coalesce(proj.fast_lane_cap, p_default_fast_lane_cap);
        fast_lane_cap := cap;
        PERFORM pg_advisory_xact_lock(hashtextextended('tidegate.fast_lane/' || p_project, 0));
        SELECT count(*) INTO inflight FROM (
            SELECT 1 FROM runs
            WHERE runs.project = p_project AND runs.lane = 'fast_lane'
              AND runs.state IN ('scheduled', 'available', 'running')
            LIMIT cap
        ) AS held;
        IF inflight >= cap THEN
            RETURN QUERY SELECT 'over_cap', NULL::bigint, NULL::bigint, cap, 0, ingest_burst,
                ingest_remaining, (
                    SELECT avg(extract(epoch FROM recent.completed_at - recent.attempted_at))::float8
                    FROM (
                        SELECT runs.completed_at, runs.attempted_at FROM runs
                        WHERE runs.project = p_project AND runs.lane = 'fast_lane'
                          AND runs.state IN ('succeeded', 'discarded', 'cancelled')
                        ORDER BY runs.completed_at DESC
                        LIMIT 20
                    ) AS recent
                );
            RETURN;
        END IF;
        fast_lane_remaining := cap - inflight - 1;

        WITH loops AS (
            SELECT w.id AS worker_id, (l.position - 1)::smallint AS workloop,
                   (l.loop ->> 'slots')::integer AS slots
            FROM workers w
            CROSS JOIN LATERAL jsonb_array_elements(w.workloops) WITH ORDINALITY AS l(loop, position)
            WHERE w.heartbeat_at > now() - make_interval(secs => p_live_seconds)
              AND (l.loop -> 'chain' ? 'fast_lane' OR l.loop -> 'chain' ? '*')
        )
        SELECT (SELECT coalesce(sum(loops.slots), 0) FROM loops)
             - (SELECT count(*) FROM runs JOIN loops
                  ON runs.worker_id = loops.worker_id AND runs.workloop = loops.workloop
                WHERE runs.state = 'running')
             - (SELECT count(*) FROM runs WHERE runs.lane = 'fast_lane' AND runs.state = 'available')
        INTO free_slots;
        IF free_slots <= 0 THEN
            -- Retry-After: a slot frees about as fast as recent fast-lane runs took.
            RETURN QUERY SELECT 'no_capacity', NULL::bigint, NULL::bigint, cap,
                fast_lane_remaining + 1, ingest_burst, ingest_remaining, (
                    SELECT avg(extract(epoch FROM recent.completed_at - recent.attempted_at))::float8
                    FROM (
                        SELECT runs.completed_at, runs.attempted_at FROM runs
                        WHERE runs.lane = 'fast_lane' AND runs.state = 'succeeded'
                          AND runs.completed_at > now() - interval '10 minutes'
                        ORDER BY runs.completed_at DESC
                        LIMIT 20
                    ) AS recent
                );
            RETURN;
        END IF;
    END IF;

    IF proj.backlog_cap IS NOT NULL THEN
        SELECT count(*) INTO backlog FROM (
            SELECT 1 FROM runs
            WHERE runs.lane = p_lane AND runs.key = p_project AND runs.state = 'available'
            LIMIT proj.backlog_cap
        ) AS ready;
        IF backlog >= proj.backlog_cap THEN
            RETURN QUERY SELECT 'backlog_full', NULL::bigint, NULL::bigint, fast_lane_cap,
                fast_lane_remaining, ingest_burst, ingest_remaining, NULL::float8;
            RETURN;
        END IF;
    END IF;

    IF proj.ingest_rate IS NOT NULL THEN
        UPDATE projects SET ingest_tat = tat WHERE id = p_project;
    END IF;
    INSERT INTO runs (project, lane, key, task, args, max_attempts)
    VALUES (p_project, p_lane, p_project, p_task, p_args, p_max_attempts)
    RETURNING id INTO new_run;
    INSERT INTO requests (project, trigger_id, run_id, idempotency_key, content_type, headers, body)
    VALUES (p_project, p_trigger_id, new_run, p_idempotency_key, p_content_type, p_headers, p_body)
    RETURNING id INTO new_request;
    PERFORM pg_notify(p_channel, p_lane);
    RETURN QUERY SELECT 'admitted', new_run, new_request, fast_lane_cap, fast_lane_remaining,
        ingest_burst, ingest_remaining, NULL::float8;
END
$$;
