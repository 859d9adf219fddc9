-- The clock functions of 0003 in PL/pgSQL, same results: a SQL function that is not
-- inlined plans its statements at every call, which made the clock of a one-run enqueue
-- cost ~0.7 ms of planning; PL/pgSQL keeps the plans for the life of the connection.

CREATE OR REPLACE FUNCTION key_weight(p_lane text, p_key text) RETURNS float8
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce(
        (SELECT weight FROM key_policies WHERE lane = p_lane AND key = p_key),
        (SELECT weight FROM key_policies WHERE lane = p_lane AND key = '*'),
        1.0
    );
END
$$;

CREATE OR REPLACE FUNCTION lane_frontier(p_lane text) RETURNS float8
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN greatest(
        (SELECT frontier FROM lane_clocks WHERE lane = p_lane),
        (SELECT max(vtime) FROM runs WHERE lane = p_lane AND state = 'running')
    );
END
$$;

CREATE OR REPLACE FUNCTION key_clock(p_lane text, p_key text) RETURNS float8
LANGUAGE plpgsql STABLE AS $$
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
