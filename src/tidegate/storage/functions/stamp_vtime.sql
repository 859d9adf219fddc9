-- A run inserted without a virtual time takes its key's next step, as an enqueued one
-- does (insert_run.sql, insert_runs.sql): key_clock + 1/weight. admit_webhook inserts its
-- runs without one; unstamped, every webhook run would have vtime 0 and go ahead of every
-- enqueued run of its lane, first in first out among webhooks, so that one tenant's burst
-- of webhooks would hold back every other tenant's. vtime 0 never comes from a stamp (the
-- clock is at least 0 and a step more than 0), so it marks a run that was not stamped.
-- The trigger's WHEN clause keeps stamped inserts (every enqueue) out of the function.
CREATE OR REPLACE FUNCTION stamp_vtime() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.vtime := key_clock(NEW.lane, NEW.key) + 1 / key_weight(NEW.lane, NEW.key);
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER runs_stamp_vtime BEFORE INSERT ON runs
FOR EACH ROW WHEN (NEW.vtime = 0) EXECUTE FUNCTION stamp_vtime();
