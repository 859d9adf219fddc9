-- Open a dashboard session: the cookie's id is stored as its sha256, so the table
-- holds nothing a reader could sign in with; token_hash is the sha256 of the token it
-- was opened with, which ends it when that token is rotated (find_ui_session).
-- Sessions past their time are deleted here, a bounded batch at a time
-- (ui_sessions_expires), so the table never needs a sweeper of its own.
WITH expired AS (
    DELETE FROM ui_sessions
    WHERE id_hash IN (
        SELECT id_hash FROM ui_sessions WHERE expires_at <= now()
        ORDER BY expires_at LIMIT 100
    )
)
INSERT INTO ui_sessions (id_hash, project, token_hash, csrf_token, expires_at)
VALUES (%(id_hash)s, %(project)s, %(token_hash)s, %(csrf_token)s,
        now() + make_interval(secs => %(seconds)s::float8))
RETURNING expires_at
