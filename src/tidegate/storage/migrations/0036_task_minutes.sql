-- Finished attempts per minute by task, for the dashboard's tasks page (schema.sql says
-- why the column). The table holds an hour of rows: rebuilding its key is quick.
ALTER TABLE minute_counts
    ADD COLUMN task text NOT NULL DEFAULT '',
    DROP CONSTRAINT minute_counts_pkey,
    ADD CONSTRAINT minute_counts_pkey PRIMARY KEY (minute, source, project, lane, task, outcome);
