-- runs_project (0011) without the runs in flight. An update that changes `state` (in
-- the predicates of the partial indexes) is never HOT, so it writes an entry in every
-- index whose predicate the new row meets: runs_project took one at each of a run's
-- writes, its claim among them, the statement a drain waits on (a claim of 32 runs
-- wrote 96 index entries beside its heap rows, now 64; the raw-SQL baseline's, 32).
-- Runs in flight are at most the workers' slots: the run lists read a project's from
-- runs_running instead (queries/list_runs.sql, list_runs_page.sql).
DROP INDEX runs_project;
CREATE INDEX runs_project ON runs (project, id) WHERE state <> 'running';
