-- Unique runs (tidegate.app.Unique): a run enqueued with a unique key is inserted only
-- if no run with that key is in one of the states the key names; otherwise the enqueue
-- returns that run. Both columns are NULL for every other run, and the index holds only
-- runs that carry a key: an ordinary run costs no index entry and no bytes beyond the
-- null bitmap it already has. Adding nullable columns without a default rewrites nothing;
-- the index is built over no rows.
ALTER TABLE runs ADD COLUMN unique_key text, ADD COLUMN unique_states run_state[];
CREATE UNIQUE INDEX runs_unique ON runs (unique_key)
    WHERE unique_key IS NOT NULL AND state = ANY (unique_states);
