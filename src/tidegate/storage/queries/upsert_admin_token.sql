-- Make a token the super admin's (TIDEGATE_ADMIN_TOKEN at start, or a rotation),
-- replacing the one before: every API process reads it at its next request. The
-- dashboard sessions opened with another token end (find_ui_session refuses them
-- already; this deletes their rows).
WITH ended AS (
    DELETE FROM ui_sessions WHERE project IS NULL AND token_hash <> %(token_hash)s
)
INSERT INTO admin_tokens (token_hash) VALUES (%(token_hash)s)
ON CONFLICT (singleton) DO UPDATE SET token_hash = excluded.token_hash, created_at = now()
RETURNING token_hash
