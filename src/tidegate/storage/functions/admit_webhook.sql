-- Admit one webhook, or say why not, in one round trip and one transaction
-- (admit_webhook.sql). Checks in order, the first that applies answers; a rejection
-- inserts nothing:
--   replayed      a repeat of an admitted request (same idempotency key on the same
--                 trigger, same body): the original run, before any limit. An advisory
--                 lock on the key serializes two copies arriving at once; the second
--                 then finds the first (requests_idempotency). Keys are per trigger: two
--                 senders may well use the same ids.
--   key_reused    the key of an admitted request with another body: no run (the IETF
--                 idempotency-key draft's 422). The bodies are compared only here, on a
--                 repeat: bytea equality looks at the lengths before it reads either
--                 value, so only a repeat of the same length reads the stored body, and
--                 an admission without a repeat pays nothing.
--   duplicate     a webhook of a unique trigger (triggers.unique_period) whose run would
--                 be like one that holds its key (p_unique_key: the library's own unique
--                 key, computed by the API process, tidegate.webhooks): that run, before
--                 any limit, as for a repeat; nothing is inserted. A run that takes the
--                 key between this look and the insert below is found there: the unique
--                 index runs_unique decides (ON CONFLICT), so webhooks arriving at once in
--                 any number of API processes make one run.
--   rate_limited  the project's ingest rate and burst (GCRA on projects.ingest_tat).
--   lane_paused   fast lane: an operator paused the lane (paused_lanes): a sync caller
--                 would only wait for a run no worker claims until it is resumed. An
--                 async webhook of a paused lane is admitted and waits.
--   breaker_open  fast lane: the run's key has an open breaker (or one forced open).
--                 A forwarding trigger's runs are keyed by their destination (its
--                 breaker key), so one dead endpoint's breaker holds back only its own.
--   over_cap      fast lane: the project's in-flight fast-lane runs are at its cap.
--                 Counted from the runs themselves (runs_fast_lane_inflight, at most cap
--                 rows) under an advisory lock on the project held to commit, so two API
--                 processes can never both take the last place, and a finished run frees
--                 its place by finishing: there is no counter to drift.
--   no_worker     fast lane: no live worker has the task and a workloop that can take
--                 fast_lane.
--   no_capacity   fast lane: no such worker has a free slot. Free slots are counted per
--                 workloop from its running runs, each at least 0: a workloop frees a
--                 slot when its handler returns, before the outcome is written (except a
--                 fast-lane run's), so for a moment the database shows it running more
--                 runs than it has slots; one workloop's unwritten outcomes then cannot
--                 hide another's free slot. An overfull workloop counts none, so the
--                 count errs towards 503, never towards admitting a run no slot can take.
--   backlog_full  the project's runs of the key in the lane not yet started (ready or
--                 pending) are at its backlog cap, counted up to the cap
--                 (unstarted_runs_of_key) under an advisory lock on (project, lane, key)
--                 held to commit, as the fast-lane cap is: without it two API processes
--                 could both count the last free place and both insert.
--   admitted      run and request inserted, the lane notified. The run is stamped
--                 with its key's next step on the lane's clock (next_vtime),
--                 as an enqueued one is (insert_run.sql).
-- The waiting room (waiting_places): a caller refused by the ingest rate, the fast-lane
-- cap or the backlog cap is given a place in that limit's line (take_place). For a cap,
-- the room it has goes first to the places ahead of a caller (places_ahead); the ingest
-- rate reserves each place's instant when it gives the place, as golang's rate.Limiter
-- Reserve does. Either way a caller that comes back with its ticket (p_ticket) at its
-- time is admitted before anyone refused after it, and a newcomer waits behind every
-- live place. The limits are decided under the same locks; a line only makes them
-- refuse sooner, and a reservation is the rate's admission, made early.
-- Retry-After (retry_after): for a place, the seconds until its due time (take_place:
-- from the places ahead and how fast the limit frees room: the ingest rate's interval;
-- the project's recent fast-lane runs' time, 9 in 10 as fast, over its cap; the key's
-- recent starts); without capacity, how long recent fast-lane runs took (a slot frees
-- about as fast); an open breaker, the rest of its cooldown.
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
    p_channel text,
    p_ticket uuid,
    p_place_grace float8,
    p_max_places integer,
    p_default_max_attempts smallint,
    p_unique_key text,
    p_unique_states run_state[]
) RETURNS TABLE (
    decision text,
    run_id bigint,
    request_id bigint,
    fast_lane_cap integer,
    fast_lane_remaining integer,
    ingest_burst integer,
    ingest_remaining integer,
    retry_after float8,
    place uuid,
    place_ahead integer
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    proj projects%ROWTYPE;
    emission float8;
    tat timestamptz;
    decided timestamptz;
    cap integer;
    inflight integer;
    free_slots bigint;
    worker_loops bigint;
    backlog integer;
    new_run bigint;
    new_request bigint;
    breaker_wait float8;
    first_run bigint;
    first_request bigint;
    same_body boolean;
    room integer;
    line record;
    given record;
    reserved_place bigint;
    reserved_at timestamptz;
    kept_ticket uuid;
    spacing float8;
    declared record;
BEGIN
    IF p_idempotency_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(
            hashtextextended('tidegate.request/' || p_trigger_id || '/' || p_idempotency_key, 0));
        SELECT r.run_id, r.id, r.body = p_body INTO first_run, first_request, same_body
        FROM requests r
        WHERE r.trigger_id = p_trigger_id AND r.idempotency_key = p_idempotency_key;
        IF FOUND AND same_body THEN
            RETURN QUERY SELECT 'replayed', first_run, first_request, NULL::integer,
                NULL::integer, NULL::integer, NULL::integer, NULL::float8, NULL::uuid,
                NULL::integer;
            RETURN;
        END IF;
        IF FOUND THEN
            RETURN QUERY SELECT 'key_reused', NULL::bigint, NULL::bigint, NULL::integer,
                NULL::integer, NULL::integer, NULL::integer, NULL::float8, NULL::uuid,
                NULL::integer;
            RETURN;
        END IF;
    END IF;

    IF p_unique_key IS NOT NULL THEN
        -- runs_unique: the predicate is the index's own.
        SELECT r.id INTO first_run FROM runs r
        WHERE r.unique_key = p_unique_key AND r.state = ANY (r.unique_states);
        IF FOUND THEN
            RETURN QUERY SELECT 'duplicate', first_run, NULL::bigint, NULL::integer,
                NULL::integer, NULL::integer, NULL::integer, NULL::float8, NULL::uuid,
                NULL::integer;
            RETURN;
        END IF;
    END IF;

    -- What the trigger leaves open (p_lane, p_max_attempts NULL: an async trigger's)
    -- the task's declared settings fill (tidegate.tasks; tasks_pkey, one probe), as for a
    -- run enqueued by name; a task no worker declared gets the defaults.
    SELECT t.lane, t.max_attempts, t.priority INTO declared FROM tasks t WHERE t.name = p_task;
    p_lane := coalesce(p_lane, declared.lane, 'default');
    p_max_attempts := coalesce(p_max_attempts, declared.max_attempts, p_default_max_attempts);

    SELECT * INTO proj FROM projects WHERE id = p_project;
    ingest_burst := proj.ingest_burst;

    IF proj.ingest_rate IS NOT NULL THEN
        -- The row lock serializes the project's admissions while the rate is decided;
        -- the new arrival time is written only if the request is admitted or given a
        -- place (which reserves its instant), so a rejection without one spends nothing.
        -- Time is read once the lock is held: now() is when the transaction began, and
        -- one that began first but got the lock second would find the arrival time its
        -- successor wrote in its future, and be refused with room left (a burst of 2
        -- admitted 1, one time in eight).
        emission := 1.0 / proj.ingest_rate;
        PERFORM FROM projects WHERE id = p_project FOR UPDATE;
        decided := clock_timestamp();
        SELECT greatest(coalesce(projects.ingest_tat, decided), decided) INTO tat
        FROM projects WHERE id = p_project;
        -- A caller back with the ticket of its place in the rate's line: the rate
        -- reserved an instant for it when it was refused, so from that instant on it is
        -- admitted without spending the rate again, and before it, told again.
        IF p_ticket IS NOT NULL THEN
            SELECT w.id, w.due_at INTO reserved_place, reserved_at FROM waiting_places w
            WHERE w.ticket = p_ticket AND w.project = p_project AND w.waits_for = 'ingest'
              AND w.lapses_at > decided;
        END IF;
        IF reserved_place IS NOT NULL AND reserved_at > decided THEN
            SELECT * INTO given FROM take_place(p_project, 'ingest', '', reserved_place, NULL,
                true, 0, reserved_at, 0, p_place_grace, p_max_places);
            RETURN QUERY SELECT 'rate_limited', NULL::bigint, NULL::bigint, NULL::integer,
                NULL::integer, proj.ingest_burst, 0, given.wait, given.ticket, given.ahead;
            RETURN;
        END IF;
        IF reserved_place IS NULL THEN
            -- Room: the admissions the rate allows now, up to the burst.
            room := least(proj.ingest_burst, greatest(0, floor(
                (extract(epoch FROM decided - tat)::float8 + proj.ingest_burst * emission)
                / emission
            )::integer));
            IF room < 1 THEN
                -- The caller's place reserves the first instant the rate allows, as an
                -- admission then would (the arrival time moves one interval): the places
                -- are due one interval apart, however many share a whole second, and a
                -- newcomer comes after them all. A line with no room for a place
                -- reserves nothing.
                SELECT * INTO given FROM take_place(p_project, 'ingest', '', NULL, NULL,
                    true, 0, tat - make_interval(secs => (proj.ingest_burst - 1) * emission),
                    0, p_place_grace, p_max_places);
                IF given.ticket IS NOT NULL THEN
                    UPDATE projects SET ingest_tat = tat + make_interval(secs => emission)
                    WHERE id = p_project;
                END IF;
                RETURN QUERY SELECT 'rate_limited', NULL::bigint, NULL::bigint, NULL::integer,
                    NULL::integer, proj.ingest_burst, 0, given.wait, given.ticket, given.ahead;
                RETURN;
            END IF;
            tat := tat + make_interval(secs => emission);
        ELSE
            -- Its reservation came due. Should a cap refuse it, its place there takes
            -- the same ticket, and the reservation is kept as long (take_place).
            kept_ticket := p_ticket;
        END IF;
        ingest_remaining := greatest(0, floor(
            (proj.ingest_burst * emission - extract(epoch FROM tat - decided)::float8)
            / emission
        )::integer);
    END IF;

    IF p_lane = 'fast_lane' THEN
        IF EXISTS (SELECT 1 FROM paused_lanes WHERE paused_lanes.lane = p_lane) THEN
            RETURN QUERY SELECT 'lane_paused', NULL::bigint, NULL::bigint, NULL::integer,
                NULL::integer, ingest_burst, ingest_remaining, NULL::float8, NULL::uuid,
                NULL::integer;
            RETURN;
        END IF;

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
                NULL::integer, ingest_burst, ingest_remaining, breaker_wait, NULL::uuid,
                NULL::integer;
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
        SELECT * INTO line FROM places_ahead(p_project, 'fast_lane', '', p_ticket, cap - inflight);
        IF cap - inflight <= line.ahead THEN
            -- A place frees as a run ends: every (time of the project's recent fast-lane
            -- runs, 9 in 10 of them as fast) / cap seconds; a second without any.
            SELECT coalesce(percentile_cont(0.9) WITHIN GROUP (
                       ORDER BY extract(epoch FROM recent.completed_at - recent.attempted_at)), 1)
                   / greatest(cap, 1)
            INTO spacing
            FROM (
                SELECT runs.completed_at, runs.attempted_at FROM runs
                WHERE runs.project = p_project AND runs.lane = 'fast_lane'
                  AND runs.state IN ('succeeded', 'discarded', 'cancelled')
                ORDER BY runs.completed_at DESC
                LIMIT 20
            ) AS recent;
            SELECT * INTO given FROM take_place(p_project, 'fast_lane', '', line.mine,
                kept_ticket, false, cap - inflight,
                clock_timestamp() + make_interval(secs => spacing), spacing, p_place_grace,
                p_max_places);
            RETURN QUERY SELECT 'over_cap', NULL::bigint, NULL::bigint, cap, 0, ingest_burst,
                ingest_remaining, given.wait, given.ticket, given.ahead;
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
                fast_lane_remaining + 1, ingest_burst, ingest_remaining, NULL::float8,
                NULL::uuid, NULL::integer;
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
                ), NULL::uuid, NULL::integer;
            RETURN;
        END IF;
    END IF;

    IF proj.backlog_cap IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(
            'tidegate.backlog/' || p_project || '/' || p_lane || '/' || p_key, 0));
        backlog := unstarted_runs_of_key(p_lane, p_key, p_project, proj.backlog_cap);
        SELECT * INTO line FROM places_ahead(p_project, 'backlog', p_key, p_ticket, proj.backlog_cap - backlog);
        IF proj.backlog_cap - backlog <= line.ahead THEN
            spacing := start_interval(p_lane, p_key, p_project);
            SELECT * INTO given FROM take_place(p_project, 'backlog', p_key, line.mine,
                kept_ticket, false, proj.backlog_cap - backlog,
                clock_timestamp() + make_interval(secs => spacing), spacing, p_place_grace,
                p_max_places);
            RETURN QUERY SELECT 'backlog_full', NULL::bigint, NULL::bigint, fast_lane_cap,
                fast_lane_remaining, ingest_burst, ingest_remaining, given.wait, given.ticket,
                given.ahead;
            RETURN;
        END IF;
    END IF;

    -- The sender's trace context, where it sent one (W3C Trace Context headers, kept
    -- with the request): the run's execution span links to it (tidegate.tracing).
    IF p_unique_key IS NULL THEN
        -- No ON CONFLICT: it would insert every run speculatively, a second WAL record
        -- per row, for the rows runs_unique never holds (insert_runs.sql measured it).
        INSERT INTO runs (project, lane, key, task, args, priority, max_attempts, vtime,
                          trace_context, in_line)
        VALUES (p_project, p_lane, p_key, p_task, p_args, coalesce(declared.priority, 0),
                p_max_attempts, next_vtime(p_lane, p_key), trace_context_of(p_headers),
                key_in_line(p_lane, p_key))
        RETURNING id INTO new_run;
    END IF;
    -- A unique key another admission or enqueue took since the look above (its insert
    -- waited for that transaction to end) inserts nothing: its holder answers, and the
    -- rate and the waiting place are not spent. A holder gone from its states by then
    -- (finished, cancelled) frees the key: the loop inserts again.
    WHILE new_run IS NULL LOOP
        INSERT INTO runs (project, lane, key, task, args, priority, max_attempts, vtime,
                          trace_context, unique_key, unique_states, in_line)
        VALUES (p_project, p_lane, p_key, p_task, p_args, coalesce(declared.priority, 0),
                p_max_attempts, next_vtime(p_lane, p_key), trace_context_of(p_headers),
                p_unique_key, p_unique_states, key_in_line(p_lane, p_key))
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state = ANY (unique_states)
        DO NOTHING
        RETURNING id INTO new_run;
        CONTINUE WHEN new_run IS NOT NULL;
        SELECT r.id INTO first_run FROM runs r
        WHERE r.unique_key = p_unique_key AND r.state = ANY (r.unique_states);
        IF FOUND THEN
            RETURN QUERY SELECT 'duplicate', first_run, NULL::bigint, NULL::integer,
                NULL::integer, NULL::integer, NULL::integer, NULL::float8, NULL::uuid,
                NULL::integer;
            RETURN;
        END IF;
    END LOOP;
    IF proj.ingest_rate IS NOT NULL AND reserved_place IS NULL THEN
        UPDATE projects SET ingest_tat = tat WHERE id = p_project;
    END IF;
    IF p_ticket IS NOT NULL THEN  -- its place is taken up
        DELETE FROM waiting_places WHERE waiting_places.ticket = p_ticket;
    END IF;
    INSERT INTO requests (project, trigger_id, run_id, idempotency_key, content_type, headers, body)
    VALUES (p_project, p_trigger_id, new_run, p_idempotency_key, p_content_type, p_headers, p_body)
    RETURNING id INTO new_request;
    PERFORM pg_notify(p_channel, p_lane);
    RETURN QUERY SELECT 'admitted', new_run, new_request, fast_lane_cap, fast_lane_remaining,
        ingest_burst, ingest_remaining, NULL::float8, NULL::uuid, NULL::integer;
END
$$;
