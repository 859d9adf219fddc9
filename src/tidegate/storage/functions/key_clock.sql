-- Where a key's next run goes on its lane's virtual clock (start-time fair queuing):
-- after the key's newest ready run, and never before the lane's clock, which is its
-- frontier (lane_frontier), or the vtime at the head of its ready runs when that is
-- further on. A run is stamped key_clock + 1/weight at enqueue (next_vtime,
-- insert_runs.sql: a batch of one key takes consecutive steps), and again when a delayed
-- or retried run comes due (stage_runs.sql, retry_run.sql). A hot key's backlog spreads
-- far into the virtual future while a cold key's next run lands at the clock, next in
-- line; a key that was idle starts from the clock again, so it cannot bank credit.
-- Every input is an index probe: enqueue writes no shared row.
--
-- The probes: the key's newest ready run through runs_key_ready (lane, key, vtime), the
-- head of the lane through runs_claim_lane (lane, rank, id). Both ask for an order an
-- index gives, and sorting is ruled out (SET enable_sort = off) so that index is the only
-- plan: with statistics taken while no run was ready (a quiet system ANALYZEd while its
-- runs were all finished), the planner expects none, every index on ready runs looks as
-- cheap, and past some backlog it would take another index of ready runs, filter the
-- key out of every ready run of the lane and sort the rest. Every enqueue, staging, retry
-- and webhook admission would then read the backlog once per key (measured: 16 ms per key
-- at 50,000 ready runs; a batch of 1,000 runs over 20 keys went from 80 to 440 ms as
-- 20,000 runs were enqueued) until autovacuum's next ANALYZE, which on a large table of
-- finished runs comes late. test_claim_plan's stale-statistics tests hold it (a 200-run batch over 20
-- keys: 1,000,020 rows scanned without the setting, 40 with it).
--
-- PL/pgSQL, as every clock function, so that its plans are kept for the connection's
-- life (a SQL function that is not inlined plans at every call: ~0.7 ms per enqueue).
CREATE OR REPLACE FUNCTION key_clock(p_lane text, p_key text) RETURNS float8
LANGUAGE plpgsql STABLE
SET enable_sort = off
AS $$
BEGIN
    RETURN greatest(
        (SELECT vtime FROM runs
         WHERE lane = p_lane AND key = p_key AND state = 'available'
         ORDER BY vtime DESC LIMIT 1),
        lane_frontier(p_lane),
        (SELECT vtime FROM runs
         WHERE lane = p_lane AND state = 'available'
         ORDER BY rank, id LIMIT 1),
        0
    );
END
$$;
