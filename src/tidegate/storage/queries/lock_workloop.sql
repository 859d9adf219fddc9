-- Serialize the claims of one workloop of a remote worker, on every API process: taken
-- first in the claim's transaction and held to its commit, so that the runs the
-- workloop holds are counted (count_held_runs) and the rest of its slots claimed
-- (claim_runs) with no other claim of it in between. Without it, two claims at once
-- both counted none held and both claimed a full workloop's worth.
-- A statement of its own: a statement reads the snapshot taken when it began, so a count
-- in the same statement as the lock would miss a claim that committed during the wait.
SELECT pg_advisory_xact_lock(
    hashtextextended('tidegate.workloop/' || %(worker_id)s::text || '/' || %(workloop)s::integer, 0)
)
