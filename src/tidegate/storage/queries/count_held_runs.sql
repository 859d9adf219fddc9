-- The runs a workloop of a remote worker holds now, under the workloop's lock held to
-- the claim's commit (functions/held_runs.sql), in the transaction that claims the rest.
SELECT held_runs(%(worker_id)s, %(workloop)s)
