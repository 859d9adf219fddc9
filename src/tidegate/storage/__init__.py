"""Storage: the embedded server, connection pools, the schema (its tables, migrations and
stored functions) and the SQL statements."""
