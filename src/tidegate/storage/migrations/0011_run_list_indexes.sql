-- The dashboard's run list (queries/list_runs_page.sql), newest first, 50 at a time.
-- Measured at 1,000,000 runs (bench/run_list.py, docs/dashboard.md): with no filter, or
-- a filter that many runs match, a backward scan of the primary key finds a page in a
-- few milliseconds; a filter that matches few runs reads the whole table (90-250 ms).
-- Two filters are worth an index; each index is one more entry to write per run.

-- A project's runs: every list a project's session shows is filtered by its project,
-- and a small project among large ones was a full scan (164 ms for 20 runs in a
-- million). One entry per enqueue; project and id never change, so nothing else.
CREATE INDEX runs_project ON runs (project, id);

-- Failed and cancelled runs, what the list is most often filtered for: when all is
-- well there are few, and `state = 'discarded'` was a full scan (79 ms for none). An
-- entry only when a run ends so, never at enqueue.
CREATE INDEX runs_failed ON runs (id) WHERE state IN ('discarded', 'cancelled');

-- Not indexed: a rare task, key or lane alone (100-250 ms); runs_key_ready and the
-- state indexes serve them with a state filter, and an index each would cost every
-- enqueue for searches an operator makes now and then.
