-- Unique webhooks: a trigger may make its webhooks' runs unique (schema.sql says why the
-- columns). Nullable columns without a default rewrite nothing; the CHECKs read no row
-- but the triggers'.
ALTER TABLE triggers
    ADD COLUMN unique_period float8,
    ADD COLUMN unique_args text[],
    ADD COLUMN unique_states run_state[],
    ADD CONSTRAINT triggers_unique_period_range CHECK (unique_period BETWEEN 1 AND 31536000),
    ADD CONSTRAINT triggers_unique_args_range CHECK (cardinality(unique_args) <= 32),
    ADD CONSTRAINT triggers_unique_needs_period
        CHECK (unique_period IS NOT NULL OR (unique_args IS NULL AND unique_states IS NULL));
