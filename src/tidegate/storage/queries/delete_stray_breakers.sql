-- Forget the breakers of a lane's keys that no longer have a breaker policy (their own
-- or the lane's default), unless an admin forced them: a policy change holds for the
-- next claim. SKIP LOCKED passes a row a completion is writing; that completion deletes
-- it itself (count_breaker_outcomes).
DELETE FROM key_breakers
WHERE (lane, key) IN (
    SELECT b.lane, b.key FROM key_breakers b
    WHERE b.lane = %(lane)s AND b.forced IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM key_policies p
          WHERE p.lane = b.lane AND p.key IN (b.key, '*')
            AND (p.breaker_failures IS NOT NULL OR p.breaker_ratio IS NOT NULL))
    FOR UPDATE SKIP LOCKED
)
RETURNING lane, key
