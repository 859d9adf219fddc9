-- One key's own policy in a lane (the dashboard's form to change it): its primary key.
SELECT * FROM key_policies WHERE lane = %(lane)s::text AND key = %(key)s::text
