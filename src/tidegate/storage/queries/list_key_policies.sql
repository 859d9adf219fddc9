SELECT * FROM key_policies
WHERE %(lane)s::text IS NULL OR lane = %(lane)s
ORDER BY lane, key = '*' DESC, key
