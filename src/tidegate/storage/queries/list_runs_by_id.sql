SELECT * FROM runs WHERE id = ANY(%(ids)s::bigint[])
