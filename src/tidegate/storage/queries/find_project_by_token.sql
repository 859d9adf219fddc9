SELECT id FROM projects WHERE token_hash = %(token_hash)s
