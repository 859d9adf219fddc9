-- A worker that stops cleanly removes its row: its capacity is gone at once.
DELETE FROM workers WHERE id = %(worker_id)s
RETURNING id
