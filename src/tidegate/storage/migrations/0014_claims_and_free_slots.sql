-- Cheaper claims where key policies are set, and the free fast-lane slots counted per
-- workloop now that a slot frees before its outcome is written (the claim's and
-- admission's functions changed here too; see functions/).
--
-- runs_running now holds (lane, key): a key's runs in flight, counted for max_running
-- and breaker probes under the key's lock for every candidate of a claim with limits,
-- were read from all the lane's running runs (with four workers of 32 slots, 128 rows
-- per candidate); now from the key's own: a 32-run claim with max_running set took
-- 2.4-3.0 ms before, 1.7-1.8 ms after. Its other readers use the lane, still its first
-- column.
DROP INDEX runs_running;
CREATE INDEX runs_running ON runs (lane, key) WHERE state = 'running';
