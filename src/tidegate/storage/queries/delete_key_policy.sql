DELETE FROM key_policies WHERE lane = %(lane)s AND key = %(key)s
RETURNING *
