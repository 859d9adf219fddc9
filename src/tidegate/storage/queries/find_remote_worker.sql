-- A remote worker of this token: its workloops and tasks, as it registered them.
SELECT workloops, tasks FROM workers WHERE id = %(worker_id)s AND token = %(token)s
