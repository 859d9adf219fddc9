-- The element-by-element sum of bucket arrays (the first one is the starting state):
-- the histograms of GET /metrics summed over workers (read_counters.sql) and folded
-- into the 'retired' worker's rows (fold_counters.sql).
CREATE OR REPLACE AGGREGATE sum_buckets(bigint[]) (SFUNC = add_buckets, STYPE = bigint[]);
