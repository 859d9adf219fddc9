-- Where one new run of a key goes on its lane's virtual clock: the key's next step,
-- key_clock + 1/weight. Stamped by the insert that makes the run (insert_run.sql,
-- admit_webhook); a batch steps each key's runs from one key_clock (insert_runs.sql).
--
-- SQL, one expression: the planner inlines it into its caller, so it costs nothing
-- over writing the expression out; key_clock and key_weight keep their plans.
CREATE OR REPLACE FUNCTION next_vtime(p_lane text, p_key text) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT key_clock(p_lane, p_key) + 1 / key_weight(p_lane, p_key)
$$;
