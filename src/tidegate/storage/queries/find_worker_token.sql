-- The worker token whose sha256 this is: its name and lanes (worker_tokens_token_hash_key).
SELECT name, lanes FROM worker_tokens WHERE token_hash = %(token_hash)s
