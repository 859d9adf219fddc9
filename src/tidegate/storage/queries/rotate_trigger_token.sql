-- Give a trigger a new URL token (triggers_token_key): the old URL finds no trigger. An
-- API process that looked the old one up goes on using it for at most a second (the
-- trigger cache of api/hooks.py); the one that rotates it, not at all.
UPDATE triggers SET token = %(token)s, updated_at = now()
WHERE project = %(project)s AND name = %(name)s
RETURNING *
