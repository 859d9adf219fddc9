-- Who holds the token whose sha256 this is: the super admin (project NULL), or a project
-- (projects_token). One lookup per authenticated request, so a rotated admin token
-- holds at once in every API process.
SELECT NULL::text AS project FROM admin_tokens WHERE token_hash = %(token_hash)s
UNION ALL
SELECT id FROM projects WHERE token_hash = %(token_hash)s
LIMIT 1
