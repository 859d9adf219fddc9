-- The runs a workloop of a remote worker holds, counted under the workloop's lock: an
-- advisory lock taken in the claim's statement (claim_workloop) and held to its commit,
-- so that the runs it holds are counted and the rest of its slots claimed (claim_runs)
-- with no other claim of it in between, on any API process. Without it, two claims at once both
-- counted none held and both claimed a full workloop's worth.
-- The count is a statement of its own after the lock, in a VOLATILE function: it reads a
-- snapshot taken once the lock is held, so it sees a claim that committed during the
-- wait (a count in the same statement as the lock would read the snapshot from before).
-- runs_held holds each workloop's runs in flight apart: the count reads this workloop's
-- entries only.
CREATE OR REPLACE FUNCTION held_runs(p_worker_id text, p_workloop integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(
        hashtextextended('tidegate.workloop/' || p_worker_id || '/' || p_workloop, 0));
    RETURN (SELECT count(*) FROM runs
            WHERE state = 'running' AND worker_id = p_worker_id AND workloop = p_workloop);
END
$$;
