-- Whether a run enqueued now for (p_lane, p_key) joins its key's line: true when the
-- key's policy, or the lane's default (key '*'), is ordered; NULL otherwise, so that the
-- run is not in runs_key_line (schema.sql) and pays no fourth index entry. Two probes of
-- key_policies_pkey, as key_weight's; fast_lane is never ordered.
CREATE OR REPLACE FUNCTION key_in_line(p_lane text, p_key text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT true
    WHERE p_lane <> 'fast_lane'
      AND coalesce(
          (SELECT ordered FROM key_policies WHERE lane = p_lane AND key = p_key),
          (SELECT ordered FROM key_policies WHERE lane = p_lane AND key = '*'))
$$;
