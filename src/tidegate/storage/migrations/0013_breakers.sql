-- Circuit breakers: one more claim-time policy per (lane, key), beside max_running and
-- rate. A key whose runs keep failing (its downstream is down) is "open": its runs are
-- not claimed, so they spend no attempt and hold no slot while the other keys get the
-- slots; after a cooldown it is "half-open" and lets a few probe runs through; a probe
-- that succeeds closes it, one that fails opens it again for twice as long (capped).

-- The policy, field by field with the lane's default '*' like the other key policies.
-- A key has a breaker when breaker_failures or breaker_ratio applies to it.
ALTER TABLE key_policies
    -- Open after this many failed attempts within the window...
    ADD COLUMN breaker_failures             integer,
    -- ...or when this share of the window's attempts failed, once it holds at least
    -- breaker_min_attempts (default 10).
    ADD COLUMN breaker_ratio                float8,
    ADD COLUMN breaker_min_attempts         integer,
    ADD COLUMN breaker_window_seconds       float8,  -- default 60
    ADD COLUMN breaker_cooldown_seconds     float8,  -- the first open period; default 30
    ADD COLUMN breaker_max_cooldown_seconds float8,  -- doubling stops here; default 600
    ADD COLUMN breaker_probes               integer, -- half-open: runs in flight; default 1
    -- The bounds of tidegate.policies, held by the database too.
    ADD CONSTRAINT key_policies_breaker_failures_range CHECK (breaker_failures >= 1),
    ADD CONSTRAINT key_policies_breaker_ratio_range CHECK (breaker_ratio > 0 AND breaker_ratio <= 1),
    ADD CONSTRAINT key_policies_breaker_min_attempts_range CHECK (breaker_min_attempts >= 1),
    ADD CONSTRAINT key_policies_breaker_window_range
        CHECK (breaker_window_seconds BETWEEN 0.1 AND 86400),
    ADD CONSTRAINT key_policies_breaker_cooldown_range
        CHECK (breaker_cooldown_seconds BETWEEN 0.1 AND 86400),
    ADD CONSTRAINT key_policies_breaker_max_cooldown_range
        CHECK (breaker_max_cooldown_seconds BETWEEN 0.1 AND 604800),
    ADD CONSTRAINT key_policies_breaker_probes_range CHECK (breaker_probes BETWEEN 1 AND 1000);

-- A breaker's state: one row per key that has failed lately, is open, or is forced;
-- a healthy key under a failure-count policy writes nothing. Written by the completion
-- statement (count_breaker_outcomes) and by an admin (forced); the claim only reads it.
-- Half-open is not stored: it is an open breaker whose open_until has passed.
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

-- What a breaker is doing, as the API, the CLI, the metrics and the dashboard name it.
CREATE FUNCTION breaker_state(b key_breakers) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN b.forced IS NOT NULL THEN 'forced_' || b.forced
        WHEN b.state = 'open' AND b.open_until > now() THEN 'open'
        WHEN b.state = 'open' THEN 'half_open'
        ELSE 'closed'
    END
$$;

-- Whether the claim took the run as a half-open breaker's probe: the probes in flight
-- are counted from the runs (ground truth: a finished or rescued probe frees its place
-- by leaving 'running'), and a probe's outcome, not an older run's, decides. Every
-- claim sets it. A new column with a constant default rewrites nothing.
ALTER TABLE runs ADD COLUMN probe boolean NOT NULL DEFAULT false;

-- Count a batch's outcomes of one key for its breaker, and open or close it; return
-- what changed ('opened', 'reopened', 'closed') or NULL. Called by complete_runs.sql
-- in (lane, key) order, so two workers' completions lock the rows in the same order;
-- claims never lock them. Only outcomes that say something about the downstream come
-- here: successes and failures (exceptions, timeouts, DownstreamFailing), never a
-- Discard (bad input), a Cancel or a Retry.
--   closed     failures (and, for a ratio, attempts) add up in a fixed window of
--              breaker_window_seconds; at breaker_failures, or at breaker_ratio of at
--              least breaker_min_attempts, it opens for breaker_cooldown_seconds. Under a
--              failure count alone, a success on a key without failures writes nothing.
--   open       outcomes of runs claimed before it opened are not news and are ignored;
--              a probe's failure opens it again for twice the cooldown, up to
--              breaker_max_cooldown_seconds; a probe's success closes it.
--   forced     an admin decides: nothing is counted.
-- A row whose key no longer has a breaker policy is deleted.
CREATE FUNCTION count_breaker_outcomes(
    p_lane text,
    p_key text,
    p_successes integer,
    p_failures integer,
    p_probe_successes integer,
    p_probe_failures integer
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    policy record;
    b key_breakers%ROWTYPE;
    cooldown float8;
BEGIN
    SELECT coalesce(own.breaker_failures, lane_default.breaker_failures) AS failures,
           coalesce(own.breaker_ratio, lane_default.breaker_ratio) AS ratio,
           coalesce(own.breaker_min_attempts, lane_default.breaker_min_attempts, 10) AS min_attempts,
           coalesce(own.breaker_window_seconds, lane_default.breaker_window_seconds, 60) AS window_seconds,
           coalesce(own.breaker_cooldown_seconds, lane_default.breaker_cooldown_seconds, 30) AS cooldown,
           coalesce(own.breaker_max_cooldown_seconds, lane_default.breaker_max_cooldown_seconds, 600) AS max_cooldown
    INTO policy
    FROM (SELECT) AS one
    LEFT JOIN key_policies own ON own.lane = p_lane AND own.key = p_key
    LEFT JOIN key_policies lane_default ON lane_default.lane = p_lane AND lane_default.key = '*';
    IF policy.failures IS NULL AND policy.ratio IS NULL THEN
        DELETE FROM key_breakers WHERE lane = p_lane AND key = p_key AND forced IS NULL;
        RETURN NULL;
    END IF;
    IF p_failures = 0 AND p_probe_successes = 0 AND policy.ratio IS NULL THEN
        RETURN NULL;  -- nothing to count, nothing that could close it
    END IF;
    SELECT * INTO b FROM key_breakers WHERE lane = p_lane AND key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO key_breakers (lane, key) VALUES (p_lane, p_key)
        ON CONFLICT (lane, key) DO NOTHING;
        SELECT * INTO b FROM key_breakers WHERE lane = p_lane AND key = p_key FOR UPDATE;
    END IF;
    IF b.forced IS NOT NULL THEN
        RETURN NULL;
    END IF;

    IF b.state = 'open' THEN
        IF p_probe_failures > 0 THEN
            cooldown := least(greatest(2 * b.cooldown_seconds, policy.cooldown),
                              greatest(policy.max_cooldown, policy.cooldown));
            UPDATE key_breakers
            SET opened_at = now(), open_until = now() + make_interval(secs => cooldown),
                cooldown_seconds = cooldown, trips = trips + 1, updated_at = now()
            WHERE lane = p_lane AND key = p_key;
            RETURN 'reopened';
        ELSIF p_probe_successes > 0 THEN
            UPDATE key_breakers
            SET state = 'closed', window_started_at = now(), attempts = 0, failures = 0,
                open_until = NULL, cooldown_seconds = NULL, updated_at = now()
            WHERE lane = p_lane AND key = p_key;
            RETURN 'closed';
        END IF;
        RETURN NULL;
    END IF;

    IF b.window_started_at <= now() - make_interval(secs => policy.window_seconds) THEN
        b.window_started_at := now();
        b.attempts := 0;
        b.failures := 0;
    END IF;
    b.attempts := b.attempts + p_successes + p_failures;
    b.failures := b.failures + p_failures;
    IF p_failures > 0 AND (
        b.failures >= policy.failures
        OR (b.attempts >= policy.min_attempts AND b.failures >= policy.ratio * b.attempts)
    ) THEN
        UPDATE key_breakers
        SET state = 'open', opened_at = now(),
            open_until = now() + make_interval(secs => policy.cooldown),
            cooldown_seconds = policy.cooldown, window_started_at = b.window_started_at,
            attempts = b.attempts, failures = b.failures, trips = trips + 1, updated_at = now()
        WHERE lane = p_lane AND key = p_key;
        RETURN 'opened';
    END IF;
    UPDATE key_breakers
    SET window_started_at = b.window_started_at, attempts = b.attempts, failures = b.failures,
        updated_at = now()
    WHERE lane = p_lane AND key = p_key;
    RETURN NULL;
END
$$;

-- The keyed claim, with the breaker's gate before the other limits (see 0007 for the
-- rest of the function, unchanged).
CREATE OR REPLACE FUNCTION claim_runs_keyed(
    p_lanes text[],
    p_wildcard boolean,
    p_demand integer,
    p_worker_id text,
    p_workloop smallint,
    p_lease_seconds float8,
    p_scan_limit integer,
    p_head_scan integer,
    p_tasks text[],
    p_live_seconds float8
) RETURNS SETOF runs
-- The candidate cursors have no LIMIT, so on a large backlog their estimated cost
-- crosses jit_above_cost, and compiling them cost more than the whole claim (measured
-- 5 ms per claim at 1,000,000 runs on PostgreSQL 15).
SET jit = off
LANGUAGE plpgsql AS $$
DECLARE
    sources integer := cardinality(p_lanes) + p_wildcard::integer;
    source integer;
    phase integer;
    head_scanned integer;
    last_rank float8;
    last_id bigint;
    frontier float8;
    candidates refcursor;
    candidate record;
    max_running integer;
    rate float8;
    rate_burst integer;
    picked bigint[] := '{}';
    strays bigint[] := '{}';
    homeless text[] := '{}';
    housed text[] := '{}';
    route text;
    gated text[] := '{}';
    taken jsonb := '{}';
    scanned integer := 0;
    gate text;
    project_gate text;
    in_flight integer;
    cap integer;
    tat timestamptz;
    probes integer;
    probing bigint[] := '{}';
    is_probe boolean;
    breaker record;
    any_policy boolean := EXISTS (SELECT 1 FROM key_policies);
    any_open boolean := EXISTS (
        SELECT 1 FROM key_breakers WHERE forced = 'open' OR (forced IS NULL AND state = 'open'));
    any_concurrency boolean := EXISTS (SELECT 1 FROM projects WHERE concurrency IS NOT NULL);
BEGIN
    FOR source IN 1 .. sources LOOP
        -- Phase 1 reads the head of the order, where keys that were at their limits
        -- wait; phase 2 goes on from the lane's frontier, past whatever gated backlog
        -- the head holds, so a capped key's runs never hold up the keys behind them.
        FOR phase IN 1 .. 2 LOOP
            IF phase = 1 THEN
                head_scanned := 0;
            ELSE
                EXIT WHEN head_scanned < p_head_scan OR cardinality(picked) >= p_demand;
                IF source <= cardinality(p_lanes) THEN
                    frontier := lane_frontier(p_lanes[source]);
                ELSE
                    SELECT min(lane_frontier(lane)) INTO frontier
                    FROM (SELECT DISTINCT lane FROM runs WHERE state = 'running') AS busy
                    WHERE lane <> ALL(p_lanes);
                END IF;
            END IF;
            IF source <= cardinality(p_lanes) AND phase = 1 THEN
                OPEN candidates FOR
                    SELECT id, lane, key, project, task, rank FROM runs
                    WHERE lane = p_lanes[source] AND state = 'available'
                    ORDER BY rank, id
                    FOR UPDATE SKIP LOCKED;
            ELSIF source <= cardinality(p_lanes) THEN
                OPEN candidates FOR
                    SELECT id, lane, key, project, task, rank FROM runs
                    WHERE lane = p_lanes[source] AND state = 'available'
                      AND (rank, id) > (last_rank, last_id)
                      AND rank >= coalesce(frontier, '-infinity')
                    ORDER BY rank, id
                    FOR UPDATE SKIP LOCKED;
            ELSIF phase = 1 THEN
                OPEN candidates FOR
                    SELECT id, lane, key, project, task, rank FROM runs
                    WHERE lane <> ALL(p_lanes) AND state = 'available'
                    ORDER BY rank, id
                    FOR UPDATE SKIP LOCKED;
            ELSE
                OPEN candidates FOR
                    SELECT id, lane, key, project, task, rank FROM runs
                    WHERE lane <> ALL(p_lanes) AND state = 'available'
                      AND (rank, id) > (last_rank, last_id)
                      AND rank >= coalesce(frontier, '-infinity')
                    ORDER BY rank, id
                    FOR UPDATE SKIP LOCKED;
            END IF;
            LOOP
                FETCH candidates INTO candidate;
                EXIT WHEN NOT FOUND;
                IF phase = 1 THEN
                    EXIT WHEN head_scanned = p_head_scan;
                    head_scanned := head_scanned + 1;
                    last_rank := candidate.rank;
                    last_id := candidate.id;
                END IF;
                scanned := scanned + 1;
                EXIT WHEN scanned > p_scan_limit;
                IF NOT candidate.task = ANY(p_tasks) THEN
                    -- Not this worker's task: another worker's, or nobody's (then it
                    -- waits in 'pending'). Each (lane, task) is asked once per claim.
                    route := candidate.lane || '/' || candidate.task;
                    IF NOT (route = ANY(homeless) OR route = ANY(housed)) THEN
                        IF task_has_worker(candidate.lane, candidate.task, p_live_seconds) THEN
                            housed := housed || route;
                        ELSE
                            homeless := homeless || route;
                        END IF;
                    END IF;
                    IF route = ANY(homeless) THEN
                        strays := strays || candidate.id;
                    END IF;
                    CONTINUE;
                END IF;
                gate := candidate.lane || '/' || candidate.key;
                project_gate := '/project/' || candidate.project;
                CONTINUE WHEN gate = ANY(gated) OR project_gate = ANY(gated);
                max_running := NULL;
                rate := NULL;
                probes := NULL;
                IF any_policy THEN
                    SELECT coalesce(own.max_running, lane_default.max_running),
                           coalesce(own.rate, lane_default.rate),
                           coalesce(own.rate_burst, lane_default.rate_burst, 1),
                           coalesce(own.breaker_probes, lane_default.breaker_probes)
                    INTO max_running, rate, rate_burst, probes
                    FROM (SELECT) AS one
                    LEFT JOIN key_policies own
                        ON own.lane = candidate.lane AND own.key = candidate.key
                    LEFT JOIN key_policies lane_default
                        ON lane_default.lane = candidate.lane AND lane_default.key = '*';
                END IF;
                -- The key's circuit breaker (read only while one is open somewhere), in
                -- every lane, fast_lane too: open, its runs are not claimed (no attempt
                -- spent, no slot taken); half-open (its cooldown over), at most `probes`
                -- of them in flight, counted from the runs under the key's lock, as
                -- max_running is. The completion statement (count_breaker_outcomes)
                -- closes or re-opens it from the probes' outcomes.
                is_probe := false;
                IF any_open THEN
                    SELECT b.forced, b.state, b.open_until INTO breaker
                    FROM key_breakers b
                    WHERE b.lane = candidate.lane AND b.key = candidate.key;
                    IF FOUND AND (breaker.forced = 'open'
                                  OR (breaker.forced IS NULL AND breaker.state = 'open')) THEN
                        IF breaker.forced = 'open' OR breaker.open_until > now()
                           OR NOT pg_try_advisory_xact_lock(hashtextextended('tidegate.key/' || gate, 0))
                        THEN
                            gated := gated || gate;
                            CONTINUE;
                        END IF;
                        SELECT count(*) INTO in_flight FROM runs
                        WHERE lane = candidate.lane AND key = candidate.key
                          AND state = 'running' AND probe;
                        IF in_flight + coalesce((taken ->> ('probe/' || gate))::integer, 0)
                           >= coalesce(probes, 1) THEN
                            gated := gated || gate;
                            CONTINUE;
                        END IF;
                        is_probe := true;
                    END IF;
                END IF;
                IF candidate.lane <> 'fast_lane' THEN
                    IF max_running IS NOT NULL THEN
                        IF NOT pg_try_advisory_xact_lock(hashtextextended('tidegate.key/' || gate, 0)) THEN
                            gated := gated || gate;
                            CONTINUE;
                        END IF;
                        SELECT count(*) INTO in_flight FROM runs
                        WHERE lane = candidate.lane AND key = candidate.key AND state = 'running';
                        IF in_flight + coalesce((taken ->> gate)::integer, 0) >= max_running THEN
                            gated := gated || gate;
                            CONTINUE;
                        END IF;
                    END IF;
                    cap := NULL;
                    IF any_concurrency THEN
                        SELECT concurrency INTO cap FROM projects WHERE id = candidate.project;
                    END IF;
                    IF cap IS NOT NULL THEN
                        IF NOT pg_try_advisory_xact_lock(hashtextextended('tidegate.project/' || candidate.project, 0)) THEN
                            gated := gated || project_gate;
                            CONTINUE;
                        END IF;
                        SELECT count(*) INTO in_flight FROM runs
                        WHERE project = candidate.project AND lane <> 'fast_lane' AND state = 'running';
                        IF in_flight + coalesce((taken ->> project_gate)::integer, 0) >= cap THEN
                            gated := gated || project_gate;
                            CONTINUE;
                        END IF;
                    END IF;
                    IF rate IS NOT NULL THEN
                        -- GCRA per key; the row lock serializes claimers of the same key.
                        INSERT INTO key_rates AS r (lane, key, tat)
                        VALUES (candidate.lane, candidate.key,
                                now() + make_interval(secs => 1.0 / rate))
                        ON CONFLICT (lane, key) DO UPDATE
                        SET tat = greatest(r.tat, now()) + make_interval(secs => 1.0 / rate)
                        WHERE greatest(r.tat, now())
                              <= now() + make_interval(secs => (rate_burst - 1) / rate)
                        RETURNING r.tat INTO tat;
                        IF NOT FOUND THEN
                            gated := gated || gate;
                            CONTINUE;
                        END IF;
                    END IF;
                    taken := taken
                        || jsonb_build_object(gate, coalesce((taken ->> gate)::integer, 0) + 1)
                        || jsonb_build_object(project_gate, coalesce((taken ->> project_gate)::integer, 0) + 1);
                END IF;
                IF is_probe THEN
                    probing := probing || candidate.id;
                    taken := taken || jsonb_build_object(
                        'probe/' || gate, coalesce((taken ->> ('probe/' || gate))::integer, 0) + 1);
                END IF;
                picked := picked || candidate.id;
                EXIT WHEN cardinality(picked) >= p_demand;
            END LOOP;
            CLOSE candidates;
            EXIT WHEN scanned > p_scan_limit OR cardinality(picked) >= p_demand;
        END LOOP;
        EXIT WHEN scanned > p_scan_limit OR cardinality(picked) >= p_demand;
    END LOOP;
    INSERT INTO lane_clocks AS c (lane, frontier)
    SELECT lane, max(vtime) FROM runs WHERE id = ANY(picked) GROUP BY lane
    ON CONFLICT (lane) DO UPDATE SET frontier = greatest(c.frontier, excluded.frontier);

    RETURN QUERY
        UPDATE runs
        SET state = 'running',
            attempt = attempt + 1,
            attempted_at = now(),
            worker_id = p_worker_id,
            workloop = p_workloop,
            lease_expires_at = now() + make_interval(secs => p_lease_seconds),
            probe = id = ANY(probing)
        WHERE id = ANY(picked)
        RETURNING *;
    RETURN QUERY
        UPDATE runs SET state = 'pending' WHERE id = ANY(strays) RETURNING *;
END
$$;

-- Admission takes the run's key: a forwarding trigger's runs are keyed by their
-- destination (its breaker key), so that one dead endpoint's breaker holds back only
-- its own runs. A sync webhook whose key's breaker is open is refused (breaker_open)
-- with the cooldown's remaining time. See 0007 for the other checks, unchanged.
DROP FUNCTION admit_webhook(bigint, text, text, text, jsonb, smallint, text, text, jsonb, bytea,
    integer, float8, text);

CREATE FUNCTION admit_webhook(
    p_trigger_id bigint,
    p_project text,
    p_lane text,
    p_task text,
    p_key text,
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
    worker_loops bigint;
    backlog integer;
    new_run bigint;
    new_request bigint;
    breaker_wait float8;
BEGIN
    IF p_idempotency_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(
            hashtextextended('tidegate.request/' || p_trigger_id || '/' || p_idempotency_key, 0));
        RETURN QUERY
            SELECT 'replayed', r.run_id, r.id, NULL::integer, NULL::integer, NULL::integer,
                   NULL::integer, NULL::float8
            FROM requests r
            WHERE r.trigger_id = p_trigger_id AND r.idempotency_key = p_idempotency_key;
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
        -- A sync caller would only wait for a run its key's open breaker holds back:
        -- 503 until the cooldown ends (a breaker forced open: for as long as it is).
        SELECT CASE WHEN b.forced = 'open' THEN NULL
                    ELSE extract(epoch FROM b.open_until - now())::float8 END
        INTO breaker_wait
        FROM key_breakers b
        WHERE b.lane = p_lane AND b.key = p_key
          AND (b.forced = 'open'
               OR (b.forced IS NULL AND b.state = 'open' AND b.open_until > now()));
        IF FOUND THEN
            RETURN QUERY SELECT 'breaker_open', NULL::bigint, NULL::bigint, NULL::integer,
                NULL::integer, ingest_burst, ingest_remaining, breaker_wait;
            RETURN;
        END IF;

        cap := coalesce(proj.fast_lane_cap, p_default_fast_lane_cap);
        fast_lane_cap := cap;
        PERFORM pg_advisory_xact_lock(hashtextextended('tidegate.fast_lane/' || p_project, 0));
        SELECT count(*) INTO inflight FROM (
            SELECT 1 FROM runs
            WHERE runs.project = p_project AND runs.lane = 'fast_lane'
              AND runs.state IN ('scheduled', 'available', 'pending', 'running')
              AND (runs.state <> 'running' OR EXISTS (
                  SELECT 1 FROM workers w
                  WHERE w.id = runs.worker_id
                    AND w.heartbeat_at > now() - make_interval(secs => p_live_seconds)))
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
              AND p_task = ANY(w.tasks)
              AND (l.loop -> 'chain' ? 'fast_lane' OR l.loop -> 'chain' ? '*')
        )
        SELECT (SELECT count(*) FROM loops),
               (SELECT coalesce(sum(loops.slots), 0) FROM loops)
             - (SELECT count(*) FROM runs JOIN loops
                  ON runs.worker_id = loops.worker_id AND runs.workloop = loops.workloop
                WHERE runs.state = 'running')
             - (SELECT count(*) FROM runs WHERE runs.lane = 'fast_lane' AND runs.state = 'available')
        INTO worker_loops, free_slots;
        IF worker_loops = 0 THEN
            RETURN QUERY SELECT 'no_worker', NULL::bigint, NULL::bigint, cap,
                fast_lane_remaining + 1, ingest_burst, ingest_remaining, NULL::float8;
            RETURN;
        END IF;
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
            WHERE runs.lane = p_lane AND runs.key = p_key AND runs.state = 'available'
              AND runs.project = p_project
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
    VALUES (p_project, p_lane, p_key, p_task, p_args, p_max_attempts)
    RETURNING id INTO new_run;
    INSERT INTO requests (project, trigger_id, run_id, idempotency_key, content_type, headers, body)
    VALUES (p_project, p_trigger_id, new_run, p_idempotency_key, p_content_type, p_headers, p_body)
    RETURNING id INTO new_request;
    PERFORM pg_notify(p_channel, p_lane);
    RETURN QUERY SELECT 'admitted', new_run, new_request, fast_lane_cap, fast_lane_remaining,
        ingest_burst, ingest_remaining, NULL::float8;
END
$$;
