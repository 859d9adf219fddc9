-- A dashboard session ends when the token it was opened with is rotated: the session
-- keeps that token's sha256 (as projects and admin_tokens keep it: nothing a reader
-- could sign in with), and find_ui_session admits it only while the project's, or the
-- super admin's, token is still that one. The sessions open now cannot say which token
-- opened them: they end here, and their holders sign in again.
DELETE FROM ui_sessions;
ALTER TABLE ui_sessions ADD COLUMN token_hash text NOT NULL;
