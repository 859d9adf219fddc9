-- Runs keyed from the webhook: a trigger's key_from names where each run takes its key
-- (schema.sql says why the column and its CHECKs). A nullable column without a default
-- rewrites nothing; the CHECKs read no row but the triggers'.
ALTER TABLE triggers
    ADD COLUMN key_from text,
    ADD CONSTRAINT triggers_key_from_valid CHECK (
        length(key_from) BETWEEN 1 AND 255
        AND (key_from ~ '^(/([^/~]|~[01])*){1,32}$'
             OR (key_from ~ '^header:[!#$%&''*+.^_`|~0-9A-Za-z-]{1,64}$'
                 AND lower(key_from) NOT IN ('header:authorization', 'header:cookie',
                                             'header:proxy-authorization')))),
    ADD CONSTRAINT triggers_key_from_not_forwarding
        CHECK (key_from IS NULL OR forward_url IS NULL);
