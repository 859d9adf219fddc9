-- Sign out: the session ends on every API process at once.
DELETE FROM ui_sessions WHERE id_hash = %(id_hash)s
RETURNING id_hash
