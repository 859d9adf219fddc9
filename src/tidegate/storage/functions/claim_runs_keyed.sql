-- Claim up to p_demand runs for one workloop, following its lane chain, with every
-- key's limits enforced in the same transaction: the claim wherever a key policy or a
-- project's concurrency is set, or a breaker is forced open (claim_runs.sql calls it
-- then, and takes runs in one set-based statement otherwise).
--
-- Sources in chain order: each named lane, then (with `*`) every other lane with a ready
-- run, lowest head first (ready_lanes), but no paused lane (paused_lanes, read once per
-- claim as the chain is made); each is one ordered scan of runs_claim_lane,
-- in (rank, id) order, locking rows as it reads them (SKIP LOCKED: claimers pass each
-- other). Each source is read in two phases: the head of the order, where keys that were
-- at their limits wait (p_head_scan rows), then on from the lane's frontier
-- (lane_frontier), past whatever gated backlog the head holds, so that a capped key's
-- runs never hold up the keys behind them. The scan stops after p_scan_limit rows: a
-- claim's cost is bounded whatever the backlog of a gated key or of a task nobody has;
-- the keys' spread on the clock keeps eligible runs near the head.
--
-- A candidate of a key whose policy is ordered (in a lane other than fast_lane) stands
-- for its key's turn, and the turn goes to the key's line's head: under the key's
-- advisory lock, one statement reads the key's run in flight (runs_running) and its
-- earliest run not started (runs_key_line, by id). A run in flight, or a head that is not
-- ready (backing off to retry, delayed, pending), or one another transaction has locked,
-- gates the key; a ready head is taken in the candidate's place, and at its vtime,
-- whatever its own place on the fair clock (a retry comes due stamped behind its key's
-- newer runs, beyond a bounded scan), and then meets the gates below as the candidate
-- would have (a head a later gate holds back keeps the earlier vtime). At most one
-- run of the key per claim. As exact as max_running: every claimer of the key holds the
-- lock, and the read, its own statement, sees every claim committed before. Measured
-- on 20,000 ready runs over 200 keys (docs/architecture.md, "Strict order per key"):
-- 1.56 ms per 32-run claim, p50, with max_running=1 on every key, 1.83 ms ordered.
--
-- A candidate of a task the claimer does not have (p_tasks) is never taken: it is left
-- for a worker that has it, or, when no live worker has it (task_has_worker, asked once
-- per (lane, task) per claim), moved to 'pending' and returned as such, so that no claim
-- reads it again. Any other candidate is taken unless its key is gated:
--   breaker      the key's circuit breaker, read only while one is open somewhere, in
--                every lane, fast_lane too. Open: its runs are not claimed (no attempt
--                spent, no slot taken). Half-open (its cooldown over): at most
--                breaker_probes of them in flight, counted from the runs (runs_running
--                with `probe`) under the key's advisory lock; the breaker is read again
--                after the count, because a probe's completion ends its run and re-opens
--                (or closes) the breaker in one transaction: read only before the
--                count, it could be seen half-open and the count find the probe gone
--                (without the second read, a run started 0.07 s after a probe had
--                re-opened a 2 s cooldown). A run so taken is marked `probe`;
--                count_breaker_outcomes closes or re-opens the breaker from the probes'
--                outcomes.
--   max_running  the key's runs in flight in the lane, counted from runs_running
--                (lane, key) under a transaction-scoped advisory lock on (lane, key).
--                Each count is its own statement, so it sees every claim committed
--                before the lock was taken: exact across any number of workers, with no
--                counter to drift. A key whose lock another claimer holds is skipped this
--                time, like a locked row.
--   concurrency  the same for the run's project across every lane but fast_lane.
--   rate         the key's GCRA state in key_rates, advanced only for runs taken.
-- fast_lane runs are exempt from all but the breaker: their bound is admission's
-- per-project cap (admit_webhook).
--
-- What each candidate costs: the lanes' default policies (key '*') are read once per
-- claim, and a key's own policy only in a lane where some key has one; what the claim
-- has taken per gate is counted from an array of the picked runs' gates. Measured on a
-- 20,000-run table with 128 runs in flight: 1.50 -> 1.29 ms per 32-run claim, p50; a
-- key's runs in flight read through runs_running (lane, key) rather than all its lane's
-- (with four workers of 32 slots, 128 rows per candidate): 2.4-3.0 -> 1.7-1.8 ms per
-- 32-run claim with max_running set.
--
-- The claimed runs get their lease from the time of the write (clock_timestamp), so a
-- claim that waited for a lock still gives a whole lease; the lane's frontier
-- (lane_clocks) moves to the newest vtime taken.
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
    -- The chain without its paused lanes (paused_lanes read once, nothing per run).
    chain text[] := ARRAY(
        SELECT wanted.lane
        FROM unnest(p_lanes || CASE WHEN p_wildcard
                                    THEN ARRAY(SELECT lane FROM ready_lanes(p_lanes))
                                    ELSE '{}' END) WITH ORDINALITY AS wanted(lane, position)
        WHERE wanted.lane <> ALL(ARRAY(SELECT lane FROM paused_lanes))
        ORDER BY wanted.position);
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
    -- The lanes where some policy says whether keys are ordered, read once per claim: a
    -- candidate elsewhere costs the ordered gate nothing.
    ordered_lanes text[] := ARRAY(
        SELECT DISTINCT p.lane FROM key_policies p WHERE p.ordered IS NOT NULL);
    key_ordered boolean;
    head_id bigint;
    head_busy boolean;
BEGIN
    FOR source IN 1 .. cardinality(chain) LOOP
        -- Phase 1 reads the head of the order, where keys that were at their limits
        -- wait; phase 2 goes on from the lane's frontier, past whatever gated backlog
        -- the head holds, so a capped key's runs never hold up the keys behind them.
        FOR phase IN 1 .. 2 LOOP
            IF phase = 1 THEN
                head_scanned := 0;
            ELSE
                EXIT WHEN head_scanned < p_head_scan OR cardinality(picked) >= p_demand;
                frontier := lane_frontier(chain[source]);
            END IF;
            IF phase = 1 THEN
                OPEN candidates FOR
                    SELECT id, lane, key, project, task, rank FROM runs
                    WHERE lane = chain[source] AND state = 'available'
                    ORDER BY rank, id
                    FOR UPDATE SKIP LOCKED;
            ELSE
                OPEN candidates FOR
                    SELECT id, lane, key, project, task, rank FROM runs
                    WHERE lane = chain[source] AND state = 'available'
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
                -- Strict order: the key's turn goes to the head of its line (above).
                IF candidate.lane = ANY(ordered_lanes) AND candidate.lane <> 'fast_lane' THEN
                    gate := candidate.lane || '/' || candidate.key;
                    CONTINUE WHEN gate = ANY(gated);
                    SELECT coalesce(own.ordered, lane_default.ordered, false) INTO key_ordered
                    FROM (SELECT) AS one
                    LEFT JOIN key_policies own
                        ON own.lane = candidate.lane AND own.key = candidate.key
                    LEFT JOIN key_policies lane_default
                        ON lane_default.lane = candidate.lane AND lane_default.key = '*';
                    IF key_ordered THEN
                        IF gate = ANY(taken)
                           OR NOT pg_try_advisory_xact_lock(hashtextextended('tidegate.key/' || gate, 0))
                        THEN
                            gated := gated || gate;
                            CONTINUE;
                        END IF;
                        SELECT (SELECT line.id FROM runs line
                                WHERE line.lane = candidate.lane AND line.key = candidate.key
                                  AND line.in_line
                                  AND line.state IN ('scheduled', 'available', 'pending')
                                ORDER BY line.id LIMIT 1),
                               EXISTS (SELECT 1 FROM runs busy
                                       WHERE busy.lane = candidate.lane AND busy.key = candidate.key
                                         AND busy.state = 'running')
                        INTO head_id, head_busy;
                        IF head_busy THEN
                            gated := gated || gate;
                            CONTINUE;
                        END IF;
                        IF head_id <> candidate.id THEN
                            -- The head takes the candidate's place on the clock too, so
                            -- the lane's frontier moves as far as the key's turn, not to
                            -- wherever the head was stamped when it came due again.
                            UPDATE runs SET vtime = least(runs.vtime, (
                                SELECT stand_in.vtime FROM runs stand_in
                                WHERE stand_in.id = candidate.id))
                            WHERE runs.id = (SELECT line.id FROM runs line
                                             WHERE line.id = head_id AND line.state = 'available'
                                             FOR UPDATE SKIP LOCKED)
                            RETURNING runs.id, runs.lane, runs.key, runs.project, runs.task,
                                      runs.rank
                            INTO candidate;
                            IF NOT FOUND THEN
                                gated := gated || gate;
                                CONTINUE;
                            END IF;
                            IF NOT candidate.task = ANY(p_tasks) THEN
                                -- Not this worker's: the key waits for one that has it.
                                gated := gated || gate;
                            END IF;
                        END IF;
                    END IF;
                END IF;
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
