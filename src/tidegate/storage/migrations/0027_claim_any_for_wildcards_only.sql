-- runs_claim_any serves only the statements that name its mark, `priority >= 0`, which
-- every run meets: the probes across lanes. A probe of one named lane took it whenever
-- the statistics said no run was ready, and read every ready run of the other lanes
-- (schema.sql says more). Built without CONCURRENTLY, inside the migration: writes to
-- runs wait for it (a few seconds per million ready runs).
DROP INDEX runs_claim_any;
CREATE INDEX runs_claim_any ON runs (rank, id) WHERE state = 'available' AND priority >= 0;
