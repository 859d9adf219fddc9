-- A project's runs of one key in a lane not yet started, counted up to p_cap: the
-- backlog cap of admit_webhook. Every run not started counts, the ready ones and those
-- waiting for a worker that has their task ('pending').
--
-- The ready runs are walked through runs_key_ready (lane, key, vtime) in clock order,
-- with sorting ruled out (SET enable_sort = off), so that index is the only plan. With
-- statistics that saw no ready run (taken on a quiet system), every index on ready runs
-- looks alike and the count would take another of them, filtering the key and the
-- project out of every ready run of the lane (measured: 23 ms per webhook at 50,000 ready runs,
-- on every admission of a project with a backlog cap, growing with the backlog; the same
-- trap as key_clock's probe). Pending runs are few (they wait for a worker that has
-- their task): read through runs_pending, only while the ready ones are under the cap.
CREATE OR REPLACE FUNCTION unstarted_runs_of_key(p_lane text, p_key text, p_project text, p_cap integer)
RETURNS integer
LANGUAGE plpgsql STABLE
SET enable_sort = off
AS $$
DECLARE
    ready integer;
BEGIN
    SELECT count(*) INTO ready FROM (
        SELECT 1 FROM runs
        WHERE runs.lane = p_lane AND runs.key = p_key AND runs.state = 'available'
          AND runs.project = p_project
        ORDER BY runs.vtime
        LIMIT p_cap
    ) AS available;
    IF ready >= p_cap THEN
        RETURN ready;
    END IF;
    RETURN ready + (SELECT count(*) FROM (
        SELECT 1 FROM runs
        WHERE runs.lane = p_lane AND runs.state = 'pending'
          AND runs.key = p_key AND runs.project = p_project
        LIMIT p_cap - ready
    ) AS pending);
END
$$;
