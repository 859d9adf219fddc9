-- Key policies (of a lane, or of all) by lane, each lane's default (key '*') first, a
-- page at a time: after the keyset (%(after_lane)s, %(after_key)s), the last policy of
-- the page before, at most %(limit)s (NULL: all). The row comparison is the ORDER BY's
-- own order ("key = '*' DESC" is "key <> '*'" ascending).
SELECT * FROM key_policies
WHERE (%(lane)s::text IS NULL OR lane = %(lane)s)
  AND (%(after_lane)s::text IS NULL
       OR (lane, key <> '*', key)
          > (%(after_lane)s::text, %(after_key)s::text <> '*', %(after_key)s::text))
ORDER BY lane, key <> '*', key
LIMIT %(limit)s::integer
