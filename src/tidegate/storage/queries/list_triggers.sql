-- Triggers (of a project, or one by id) in id order, a page at a time: after the keyset
-- %(after)s (the last id of the page before), at most %(limit)s (NULL: all).
SELECT * FROM triggers
WHERE (%(project)s::text IS NULL OR project = %(project)s)
  AND (%(id)s::bigint IS NULL OR id = %(id)s)
  AND (%(after)s::bigint IS NULL OR id > %(after)s)
ORDER BY id
LIMIT %(limit)s::integer
