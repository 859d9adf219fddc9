"""Storage: the embedded server, connection pools, migrations and the SQL statements."""
