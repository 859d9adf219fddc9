-- Three CHECKs held less than tidegate.limits declares for their fields: a trigger's
-- sync_timeout_seconds (more than 0, no upper end) and forward_timeout_seconds (more
-- than 0), a key policy's breaker_ratio (more than 0). Every write through tidegate was
-- held to the declaration already (0.001 to 3600 seconds, 0.001 to 300 seconds, 0.01 to
-- 1); the database now holds the same, and tests/test_bounds.py checks that every CHECK
-- of a declared field says what its declaration says.
--
-- A value another writer stored past them is brought to the nearest end of its range
-- first: the closest to what it asked for that tidegate can hold.
UPDATE triggers
SET sync_timeout_seconds = least(greatest(sync_timeout_seconds, 0.001), 3600)
WHERE sync_timeout_seconds NOT BETWEEN 0.001 AND 3600;

UPDATE triggers
SET forward_timeout_seconds = greatest(forward_timeout_seconds, 0.001)
WHERE forward_timeout_seconds < 0.001;

UPDATE key_policies
SET breaker_ratio = greatest(breaker_ratio, 0.01)
WHERE breaker_ratio < 0.01;

ALTER TABLE triggers
    DROP CONSTRAINT triggers_sync_timeout_range,
    ADD CONSTRAINT triggers_sync_timeout_range
        CHECK (sync_timeout_seconds BETWEEN 0.001 AND 3600),
    DROP CONSTRAINT triggers_forward_timeout_range,
    ADD CONSTRAINT triggers_forward_timeout_range
        CHECK (forward_timeout_seconds BETWEEN 0.001 AND 300);

ALTER TABLE key_policies
    DROP CONSTRAINT key_policies_breaker_ratio_range,
    ADD CONSTRAINT key_policies_breaker_ratio_range CHECK (breaker_ratio BETWEEN 0.01 AND 1);
