-- The first server to start without TIDEGATE_ADMIN_TOKEN stores the one admin token;
-- the singleton key makes concurrent first starts agree: one inserts, the others read.
INSERT INTO admin_tokens (token_hash) VALUES (%(token_hash)s)
ON CONFLICT (singleton) DO NOTHING
RETURNING token_hash
