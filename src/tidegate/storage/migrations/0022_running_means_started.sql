-- Every run claimed is a run started, and guarantees that hold when the database stalls
-- (docs/guarantees.md):
--
-- - unstarted_runs_of_key: a project's backlog cap counts every run of the key not yet
--   started, those waiting for a worker that has their task ('pending') too, not only
--   the ready ones (ready_runs_of_key, 0020, which it replaces).
-- - admit_webhook as in 0020 but: the fast-lane cap counts every run in flight, a silent
--   worker's included, until a rescuer takes it back (before, a run whose worker missed
--   heartbeats stopped counting at once, though its handler might still execute: a
--   stalled worker's runs let new ones in over the cap); the workers' liveness is read
--   at the time of the read, not the transaction's start (it may have waited for the
--   project's lock); and the backlog count above.
-- - claim_runs_keyed as in 0018 but a lease runs from the time of the write.
-- - count_breaker_outcomes as in 0013 but escalated once per half-open round: a probe's
--   outcome counts only if the probe was claimed after the breaker last opened (its
--   claim time, which complete_runs.sql now passes instead of counts), under the key's
--   lock. With breaker_probes 2, two failed probes written in separate batches took the
--   cooldown 1 -> 2 -> 4 s and the trips 1 -> 3 in one round, and a late probe's success
--   could close a breaker that another probe had just reopened.

CREATE FUNCTION unstarted_runs_of_key(p_lane text, p_key text, p_project text, p_cap integer)
RETURNS integer
LANGUAGE plpgsql STABLE
-- As ready_runs_of_key (0020): the ready runs through runs_key_ready in clock order, sorting
-- ruled out so that stale statistics cannot pick another plan. Pending runs are few (they
-- wait for a worker that has their task): read through runs_waiting.
SET enable_sort = off
AS $$
DECLARE
    ready integer;
BEGIN
    SELECT count(*) INTO ready FROM (
        SELECT 1 FROM runs
        WHERE runs.lane = p_lane AND runs.key = p_key AND runs.state = 'available'
          AND runs.project = p_project
        ORDER BY runs.vtime
        LIMIT p_cap
    ) AS available;
    IF ready >= p_cap THEN
        RETURN ready;
    END IF;
    RETURN ready + (SELECT count(*) FROM (
        SELECT 1 FROM runs
        WHERE runs.lane = p_lane AND runs.state = 'pending'
          AND runs.key = p_key AND runs.project = p_project
        LIMIT p_cap - ready
    ) AS pending);
END
$$;

CREATE OR REPLACE FUNCTION admit_webhook(
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
        -- Every run in flight counts, a silent worker's too: its handler may still execute
        -- (a stalled heartbeat is not a dead worker). It stops counting once a rescuer
        -- (any worker, or an API process) has taken it back after its lease lapsed.
        SELECT count(*) INTO inflight FROM (
            SELECT 1 FROM runs
            WHERE runs.project = p_project AND runs.lane = 'fast_lane'
              AND runs.state IN ('scheduled', 'available', 'pending', 'running')
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
            -- The time now, not the transaction's start: it may have waited for the lock.
            WHERE w.heartbeat_at > clock_timestamp() - make_interval(secs => p_live_seconds)
              AND p_task = ANY(w.tasks)
              AND (l.loop -> 'chain' ? 'fast_lane' OR l.loop -> 'chain' ? '*')
        )
        SELECT (SELECT count(*) FROM loops),
               (SELECT coalesce(sum(greatest(loops.slots - (
                    SELECT count(*) FROM runs
                    WHERE runs.worker_id = loops.worker_id AND runs.workloop = loops.workloop
                      AND runs.state = 'running'), 0)), 0)
                FROM loops)
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
        backlog := unstarted_runs_of_key(p_lane, p_key, p_project, proj.backlog_cap);
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

DROP FUNCTION ready_runs_of_key(text, text, text, integer);

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
    taken text[] := '{}';
    -- The gates (lane/key, /project/..., probe/lane/key) of the runs picked so far, one
    -- entry per run: how many a gate has taken in this claim is its count here.
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
    -- The lanes' default policies (key '*'), read once per claim; a key's own policy is
    -- looked up only in a lane where some key has one.
    lane_defaults jsonb := (
        SELECT coalesce(jsonb_object_agg(lane, to_jsonb(key_policies)), '{}')
        FROM key_policies WHERE key = '*');
    own_lanes text[] := ARRAY(SELECT DISTINCT lane FROM key_policies WHERE key <> '*');
    lane_default jsonb;
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
                IF candidate.lane = ANY(own_lanes) THEN
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
                ELSIF any_policy THEN
                    lane_default := lane_defaults -> candidate.lane;
                    IF lane_default IS NOT NULL THEN
                        max_running := (lane_default ->> 'max_running')::integer;
                        rate := (lane_default ->> 'rate')::float8;
                        rate_burst := coalesce((lane_default ->> 'rate_burst')::integer, 1);
                        probes := (lane_default ->> 'breaker_probes')::integer;
                    END IF;
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
                        -- The breaker again, read after the count: a probe's completion
                        -- ends its run and re-opens (or closes) the breaker in one
                        -- transaction, so this read is at least as new as the count.
                        SELECT b.forced, b.state, b.open_until INTO breaker
                        FROM key_breakers b
                        WHERE b.lane = candidate.lane AND b.key = candidate.key;
                        IF FOUND AND (breaker.forced = 'open'
                                      OR (breaker.forced IS NULL AND breaker.state = 'open')) THEN
                            IF breaker.forced = 'open' OR breaker.open_until > now()
                               OR in_flight + cardinality(array_positions(taken, 'probe/' || gate))
                                  >= coalesce(probes, 1) THEN
                                gated := gated || gate;
                                CONTINUE;
                            END IF;
                            is_probe := true;
                        END IF;
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
                        IF in_flight + cardinality(array_positions(taken, gate)) >= max_running THEN
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
                        IF in_flight + cardinality(array_positions(taken, project_gate)) >= cap THEN
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
                    taken := taken || ARRAY[gate, project_gate];
                END IF;
                IF is_probe THEN
                    probing := probing || candidate.id;
                    taken := taken || ('probe/' || gate);
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
            -- The time of the write: a claim that waited for a lock still gets a whole lease.
            lease_expires_at = clock_timestamp() + make_interval(secs => p_lease_seconds),
            probe = id = ANY(probing)
        WHERE id = ANY(picked)
        RETURNING *;
    RETURN QUERY
        UPDATE runs SET state = 'pending' WHERE id = ANY(strays) RETURNING *;
END
$$;

DROP FUNCTION count_breaker_outcomes(text, text, integer, integer, integer, integer);

CREATE FUNCTION count_breaker_outcomes(
    p_lane text,
    p_key text,
    p_successes integer,
    p_failures integer,
    p_probe_succeeded_at timestamptz,
    p_probe_failed_at timestamptz
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
    IF p_failures = 0 AND p_probe_succeeded_at IS NULL AND policy.ratio IS NULL THEN
        RETURN NULL;  -- nothing to count, nothing that could close it
    END IF;
    IF p_probe_succeeded_at IS NOT NULL OR p_probe_failed_at IS NOT NULL THEN
        -- The key's lock, which a claim holds from counting the probes in flight to its
        -- commit: a probe claimed while the breaker was half-open has its claim
        -- committed before this reads the breaker, and one claimed after sees what
        -- this writes. So a probe's claim time tells its round (below).
        PERFORM pg_advisory_xact_lock(hashtextextended('tidegate.key/' || p_lane || '/' || p_key, 0));
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
        -- Only probes claimed since it last opened speak for this half-open round: a
        -- probe of an earlier round, whose outcome comes late (its batch was written
        -- after another probe's), neither escalates the cooldown a second time nor
        -- closes a breaker that round's failure has just reopened.
        IF p_probe_failed_at > b.opened_at THEN
            cooldown := least(greatest(2 * b.cooldown_seconds, policy.cooldown),
                              greatest(policy.max_cooldown, policy.cooldown));
            UPDATE key_breakers
            SET opened_at = clock_timestamp(),
                open_until = clock_timestamp() + make_interval(secs => cooldown),
                cooldown_seconds = cooldown, trips = trips + 1, updated_at = now()
            WHERE lane = p_lane AND key = p_key;
            RETURN 'reopened';
        ELSIF p_probe_succeeded_at > b.opened_at THEN
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
        SET state = 'open', opened_at = clock_timestamp(),
            open_until = clock_timestamp() + make_interval(secs => policy.cooldown),
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
