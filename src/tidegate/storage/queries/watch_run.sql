-- A reader of the run's events waits for it to finish: its final transition NOTIFYs its
-- id (complete_runs, cancel_run, rescue_runs). The update takes the row's lock, so the
-- reader's next look at the run, after this commits, sees either a run that will
-- NOTIFY or one that has finished.
UPDATE runs SET watched = true
WHERE id = %(id)s AND NOT watched AND state NOT IN ('succeeded', 'discarded', 'cancelled')
RETURNING id
