-- Give a project a new API token: the old one is refused from the next request on, in
-- every API process (find_caller reads the digest per request), and the dashboard
-- sessions opened with it end (find_ui_session refuses them; this deletes their rows).
WITH ended AS (
    DELETE FROM ui_sessions WHERE project = %(id)s
)
UPDATE projects SET token_hash = %(token_hash)s, updated_at = now()
WHERE id = %(id)s
RETURNING id, updated_at
