-- A remote worker's claim for one workloop, in one statement (api/workers.py, the claim
-- route): the API runs it for the worker, which holds no database connection.
--
-- 0. The worker must still be registered under the token the call brought
--    (p_token_hash): else nothing is done and `free` is NULL (the API's Guard remembers
--    a claiming worker's token instead of looking it up at every call: this is the
--    check).
-- 1. The outcomes the claim carries (p_outcomes: complete_runs' JSON array, or NULL)
--    are written first, so that the slots they free are claimed in the same call:
--    `recorded` are the ids written, `breakers` the circuit breakers that opened or
--    closed ({lane, key, change} each). The API notes the outcomes that came too late
--    (note_late_outcomes.sql).
-- 2. held_runs takes the workloop's lock and counts the runs it holds, in a statement of
--    its own after the lock (so it sees every claim committed while it waited): `free`
--    is p_slots less those. The lock is held to the commit, so no other claim of the
--    workloop, on any API process, counts or claims in between: its slots are never
--    exceeded, whatever a worker sends.
-- 3. Where slots are free, claim_runs takes up to p_demand of them; `claimed` counts the
--    runs taken (those it set 'pending', of tasks no live worker has, are left out) and
--    `runs` holds them as one JSON array of rows, each in `columns`' order, so the API
--    writes them into its answer as they are, without reading them.
-- The outcomes commit without waiting for the WAL flush (complete_runs sets that for
-- the transaction), a claim through it (docs/architecture.md, "What commits how"): a
-- claim that took runs puts back the connection's own setting, read before.
-- A statement instead of a transaction of five: each round trip from the API costs it
-- more CPU than the runs it carries (docs/benchmarks.md, "Remote workers").
CREATE OR REPLACE FUNCTION claim_workloop(
    p_token_hash text,
    p_worker_id text,
    p_workloop smallint,
    p_slots integer,
    p_demand integer,
    p_outcomes jsonb,
    p_completed_channel text,
    p_channel text,
    p_lanes text[],
    p_wildcard boolean,
    p_demands integer[],
    p_others_demand integer,
    p_lease_seconds float8,
    p_scan_limit integer,
    p_head_scan integer,
    p_tasks text[],
    p_live_seconds float8,
    OUT free integer,
    OUT claimed integer,
    OUT columns text[],
    OUT runs text,
    OUT recorded bigint[],
    OUT breakers text
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    commit_mode text := current_setting('synchronous_commit');
BEGIN
    IF NOT EXISTS (SELECT 1 FROM workers w JOIN worker_tokens t ON t.name = w.token
                   WHERE w.id = p_worker_id AND t.token_hash = p_token_hash) THEN
        RETURN;
    END IF;
    IF p_outcomes IS NOT NULL THEN
        SELECT coalesce(array_agg(c.id) FILTER (WHERE c.id IS NOT NULL), '{}'),
               coalesce(json_agg(json_build_object('lane', c.lane, 'key', c.key,
                                                   'change', c.change))
                        FILTER (WHERE c.change IS NOT NULL), '[]')::text
        INTO recorded, breakers
        FROM complete_runs(p_worker_id, p_completed_channel, p_channel, p_outcomes, '[]') AS c;
    END IF;
    free := p_slots - held_runs(p_worker_id, p_workloop);
    columns := ARRAY[
        'id', 'project', 'lane', 'key', 'task', 'args', 'state', 'priority', 'attempt',
        'max_attempts', 'scheduled_at', 'inserted_at', 'attempted_at', 'completed_at',
        'worker_id', 'lease_expires_at', 'result', 'errors', 'idempotency_key', 'workloop',
        'vtime', 'rank', 'probe', 'watched', 'unique_key', 'unique_states', 'trace_context'];
    claimed := 0;
    runs := '[]';
    IF free > 0 THEN
        SELECT count(*), coalesce(json_agg(json_build_array(
                   r.id, r.project, r.lane, r.key, r.task, r.args, r.state, r.priority,
                   r.attempt, r.max_attempts, r.scheduled_at, r.inserted_at, r.attempted_at,
                   r.completed_at, r.worker_id, r.lease_expires_at, r.result, r.errors,
                   r.idempotency_key, r.workloop, r.vtime, r.rank, r.probe, r.watched,
                   r.unique_key, r.unique_states, r.trace_context)), '[]')::text
        INTO claimed, runs
        FROM claim_runs(
            p_lanes, p_wildcard, least(p_demand, free), p_demands, p_others_demand,
            p_worker_id, p_workloop, p_lease_seconds, p_scan_limit, p_head_scan, p_tasks,
            p_live_seconds
        ) AS r
        WHERE r.state = 'running';
        IF claimed > 0 THEN
            PERFORM set_config('synchronous_commit', commit_mode, true);
        END IF;
    END IF;
END
$$;
