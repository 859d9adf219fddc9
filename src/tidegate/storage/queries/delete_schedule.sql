-- Delete a schedule; its runs stay.
DELETE FROM schedules WHERE project = %(project)s AND name = %(name)s RETURNING id
