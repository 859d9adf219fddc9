-- Hand a key's breaker back to its policy: forget it, so that it starts closed and
-- counts afresh.
DELETE FROM key_breakers WHERE lane = %(lane)s AND key = %(key)s
RETURNING lane, key
