-- The session a dashboard cookie names, if it has not expired: whose it is (project
-- NULL: the super admin's) and its CSRF token. One primary-key probe per request.
SELECT project, csrf_token FROM ui_sessions
WHERE id_hash = %(id_hash)s AND expires_at > now()
