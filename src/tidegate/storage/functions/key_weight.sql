-- The weight of a key in a lane: its own policy, else the lane's default (key '*'),
-- else 1. A key's runs step 1/weight apart on the lane's virtual clock (key_clock), so
-- a key of weight 2 gets twice the claims of a key of weight 1 while both have runs
-- ready.
--
-- PL/pgSQL rather than SQL, as every clock function: a SQL function that is not inlined
-- plans its statements at every call (the clock of a one-run enqueue cost ~0.7 ms of
-- planning); PL/pgSQL keeps the plans for the life of the connection.
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
