-- A run inserted without a virtual time takes its key's next step, as an enqueued one
-- does (insert_runs, insert_run): key_clock + 1/weight. admit_webhook (0002) inserts its
-- runs without one, so since 0003 every webhook run had vtime 0 and went ahead of every
-- enqueued run of its lane, first in first out among webhooks: one tenant's burst of
-- webhooks held back every other tenant's. vtime 0 never comes from a stamp (the clock
-- is at least 0 and a step more than 0), so it marks a run that was not stamped. The
-- WHEN clause keeps stamped inserts (every enqueue) out of the function.
CREATE FUNCTION stamp_vtime() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.vtime := key_clock(NEW.lane, NEW.key) + 1 / key_weight(NEW.lane, NEW.key);
    RETURN NEW;
END
$$;

CREATE TRIGGER runs_stamp_vtime BEFORE INSERT ON runs
FOR EACH ROW WHEN (NEW.vtime = 0) EXECUTE FUNCTION stamp_vtime();
