SELECT * FROM triggers
WHERE (%(project)s::text IS NULL OR project = %(project)s)
  AND (%(id)s::bigint IS NULL OR id = %(id)s)
ORDER BY id
