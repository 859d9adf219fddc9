-- A run whose task no live worker has waits in 'pending', out of the claim's indexes,
-- until a worker that has the task starts (0007). Alone in its migration: a value added
-- to an enum cannot be used in the transaction that adds it.
ALTER TYPE run_state ADD VALUE 'pending' AFTER 'available';
