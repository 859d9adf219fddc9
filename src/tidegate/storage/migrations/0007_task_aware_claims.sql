-- Workers claim only runs of tasks they have (DESIGN.md, invariant 9).
--
-- A worker advertises its tasks in its row. A claim skips the runs of tasks the claimer
-- lacks; those no live worker has go to 'pending' (0006), out of the claim's indexes,
-- and a worker that has the task makes them available again (stage_runs). So a run of a
-- task nobody has spends no attempt, and a backlog of them costs a claim a bounded scan
-- once, not at every claim.

ALTER TABLE workers ADD COLUMN tasks text[] NOT NULL DEFAULT '{}';

-- The stager of a worker that has a task: its pending runs.
CREATE INDEX runs_pending ON runs (task) WHERE state = 'pending';

-- Whether a live worker has the task and a workloop whose chain takes the lane: else
-- nothing can run it, and it waits in 'pending'. Workers are few; a scan is cheap.
CREATE FUNCTION task_has_worker(p_lane text, p_task text, p_live_seconds float8)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM workers w
        CROSS JOIN LATERAL jsonb_array_elements(w.workloops) AS l(loop)
        WHERE w.heartbeat_at > now() - make_interval(secs => p_live_seconds)
          AND p_task = ANY(w.tasks)
          AND (l.loop -> 'chain' ? p_lane OR l.loop -> 'chain' ? '*')
    );
END
$$;

-- The strays at the head of the lanes a worker takes (the parker, queries/park_strays.sql):
-- of the first p_scan_limit available runs of each lane its chains take, those of tasks
-- it lacks and no live worker has, set 'pending' and returned. The heads are read
-- without locks; only the strays are locked, and SKIP LOCKED passes a row a claim (or
-- another worker's parker) holds: a claim never waits on a parker, nor a parker on
-- another. A function, so its plans are kept for the connection's life.
CREATE FUNCTION park_strays(
    p_lanes text[],
    p_wildcard boolean,
    p_tasks text[],
    p_scan_limit integer,
    p_live_seconds float8
) RETURNS SETOF runs
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    WITH head AS (
        SELECT probe.id, probe.lane, probe.task
        FROM unnest(p_lanes) AS chain(lane)
        CROSS JOIN LATERAL (
            SELECT runs.id, runs.lane, runs.task FROM runs
            WHERE runs.lane = chain.lane AND runs.state = 'available'
            ORDER BY runs.rank, runs.id
            LIMIT p_scan_limit
        ) AS probe
        UNION ALL
        SELECT any_lane.id, any_lane.lane, any_lane.task FROM (
            SELECT runs.id, runs.lane, runs.task FROM runs
            WHERE p_wildcard AND runs.state = 'available' AND runs.lane <> ALL(p_lanes)
            ORDER BY runs.rank, runs.id
            LIMIT p_scan_limit
        ) AS any_lane
    ),
    strays AS (
        SELECT runs.id FROM runs
        WHERE runs.id = ANY(ARRAY(
                SELECT head.id FROM head
                WHERE NOT head.task = ANY(p_tasks)
                  AND NOT task_has_worker(head.lane, head.task, p_live_seconds)))
          AND runs.state = 'available'
        FOR UPDATE SKIP LOCKED
    )
    UPDATE runs SET state = 'pending'
    FROM strays
    WHERE runs.id = strays.id
    RETURNING runs.*;
END
$$;

-- The keyed claim takes the claimer's tasks (and how recent a live worker's heartbeat
-- is) and gets a name of its own: queries/claim_runs.sql calls it where limits are set.
DROP FUNCTION claim_runs(text[], boolean, integer, text, smallint, float8, integer, integer);

-- Claim up to p_demand runs for one workloop, following its lane chain, with every
-- key's limits enforced in the same transaction. (Where no limits are set anywhere,
-- queries/claim_runs.sql takes runs in one set-based statement instead.)
--
-- Sources in chain order: each named lane, then (with `*`) every other lane; each is
-- one ordered scan of its index, locking rows as it reads them (SKIP LOCKED: claimers
-- pass each other). A candidate is taken unless its key is gated:
--   max_running  the key's runs in flight in the lane, counted from the runs table
--                under a transaction-scoped advisory lock on (lane, key). Each count is
--                its own statement, so it sees every claim committed before the lock
--                was taken: exact across any number of workers. A key whose lock another
--                claimer holds is skipped this time, like a locked row.
--   concurrency  the same for the run's project across every lane but fast_lane.
--   rate         the key's GCRA state in key_rates, advanced only for runs taken.
-- fast_lane runs are exempt (their bound is admission's per-project cap).
-- A candidate of a task the claimer does not have (p_tasks) is never taken: it is left
-- for a worker that has it, or, when no live worker has it (task_has_worker), moved to
-- 'pending' and returned as such, so no claim reads it again.
-- The scan stops after p_scan_limit rows: a claim's cost is bounded whatever the
-- backlog of a gated key or of a task nobody has; the keys' spread on the clock keeps
-- eligible runs near the head.
CREATE FUNCTION claim_runs_keyed(
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
    any_policy boolean := EXISTS (SELECT 1 FROM key_policies);
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
                IF candidate.lane <> 'fast_lane' THEN
                    max_running := NULL;
                    rate := NULL;
                    IF any_policy THEN
                        SELECT coalesce(own.max_running, lane_default.max_running),
                               coalesce(own.rate, lane_default.rate),
                               coalesce(own.rate_burst, lane_default.rate_burst, 1)
                        INTO max_running, rate, rate_burst
                        FROM (SELECT) AS one
                        LEFT JOIN key_policies own
                            ON own.lane = candidate.lane AND own.key = candidate.key
                        LEFT JOIN key_policies lane_default
                            ON lane_default.lane = candidate.lane AND lane_default.key = '*';
                    END IF;
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
            lease_expires_at = now() + make_interval(secs => p_lease_seconds)
        WHERE id = ANY(picked)
        RETURNING *;
    RETURN QUERY
        UPDATE runs SET state = 'pending' WHERE id = ANY(strays) RETURNING *;
END
$$;

-- Idempotency keys are scoped per trigger (admit_webhook).
DROP INDEX requests_idempotency;
CREATE UNIQUE INDEX requests_idempotency ON requests (trigger_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The fast-lane cap counts pending runs too: they are in flight until they finish.
DROP INDEX runs_fast_lane_inflight;
CREATE INDEX runs_fast_lane_inflight ON runs (project)
    WHERE lane = 'fast_lane' AND state IN ('scheduled', 'available', 'pending', 'running');

-- Admit one webhook, or say why not, in one round trip and one transaction.
--
-- Checks in order, the first that applies answers; a rejection inserts nothing:
--   replayed      a repeat of an admitted request (same idempotency key on the same
--                 trigger): the original run, before any limit. An advisory lock on the
--                 key serializes two copies arriving at once; the second then finds the
--                 first. Keys are per trigger: two senders may well use the same ids.
--   rate_limited  the project's ingest rate and burst (GCRA on projects.ingest_tat).
--   over_cap      fast lane: the project's in-flight fast-lane runs are at its cap.
--                 Counted from the runs themselves (runs_fast_lane_inflight, at most
--                 cap rows) under an advisory lock on the project held to commit, so
--                 two API processes can never both take the last place, and a finished
--                 run frees its place by finishing: there is no counter to drift. A
--                 running run of a worker that is no longer live holds no place: the
--                 cap is free again as soon as a crashed worker counts as dead, with
--                 or without a rescuer, and callers hear that no worker is left.
--   no_worker     fast lane: no live worker has the task and a slot that can take it.
--   no_capacity   fast lane: no such worker has a free slot.
--   backlog_full  the project's ready runs in the lane (its webhooks' key is the
--                 project) are at its backlog cap, counted up to the cap.
--   admitted      run and request inserted, the lane notified.
CREATE OR REPLACE FUNCTION admit_webhook(
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
    worker_loops bigint;
    backlog integer;
    new_run bigint;
    new_request bigint;
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

-- The bounds of rates and weights (tidegate.limits), held by the database too: 1/rate
-- and 1/weight become intervals and clock steps in every claim, and a value past them
-- (a rate of 1e-20 overflows make_interval) would fail every claim of its lane. Values
-- stored before the bounds existed are brought inside them first.
UPDATE key_policies SET
    rate = least(greatest(rate, 0.001), 1000000),
    weight = least(greatest(weight, 0.001), 1000)
WHERE rate NOT BETWEEN 0.001 AND 1000000 OR weight NOT BETWEEN 0.001 AND 1000;
ALTER TABLE key_policies
    DROP CONSTRAINT key_policies_rate_range,
    DROP CONSTRAINT key_policies_weight_range,
    ADD CONSTRAINT key_policies_rate_range CHECK (rate BETWEEN 0.001 AND 1000000),
    ADD CONSTRAINT key_policies_weight_range CHECK (weight BETWEEN 0.001 AND 1000);
UPDATE projects SET ingest_rate = least(greatest(ingest_rate, 0.001), 1000000)
WHERE ingest_rate NOT BETWEEN 0.001 AND 1000000;
ALTER TABLE projects
    DROP CONSTRAINT projects_ingest_rate_range,
    ADD CONSTRAINT projects_ingest_rate_range CHECK (ingest_rate BETWEEN 0.001 AND 1000000);
