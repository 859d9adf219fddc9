DELETE FROM key_policies WHERE lane = %(lane)s AND key = %(key)s
RETURNING lane, key, max_running, weight, rate, rate_burst, updated_at
