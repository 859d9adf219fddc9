-- The session a dashboard cookie names, if it has not expired and the token it was
-- opened with is still its holder's (a rotated token ends its sessions at once, on every
-- API process): whose it is (project NULL: the super admin's) and its CSRF token. One
-- primary-key probe per request, and one of projects_pkey (or the admin_tokens row).
SELECT s.project, s.csrf_token FROM ui_sessions s
WHERE s.id_hash = %(id_hash)s AND s.expires_at > now()
  AND s.token_hash = CASE WHEN s.project IS NULL
                          THEN (SELECT token_hash FROM admin_tokens)
                          ELSE (SELECT token_hash FROM projects WHERE id = s.project) END
