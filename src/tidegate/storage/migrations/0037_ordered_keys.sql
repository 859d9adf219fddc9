-- Strict order per key (tidegate.policies, `ordered`): a policy field, and the index
-- the claim finds a key's earliest unfinished run through (schema.sql says why each).
-- The index is built under a lock that lets reads (claims among them) go on and makes
-- writes of runs wait for the build: a scan of the table, a few seconds per million runs.
ALTER TABLE key_policies ADD COLUMN ordered boolean;
ALTER TABLE runs ADD COLUMN in_line boolean;
CREATE INDEX runs_key_line ON runs (lane, key, id)
    WHERE in_line AND state IN ('scheduled', 'available', 'pending');
