-- A new worker token (its sha256; the token itself is shown once, never stored).
INSERT INTO worker_tokens (name, token_hash, lanes)
VALUES (%(name)s, %(token_hash)s, %(lanes)s::text[])
RETURNING created_at
