SELECT * FROM runs WHERE id = %(id)s
