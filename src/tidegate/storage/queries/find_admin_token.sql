SELECT token_hash FROM admin_tokens
