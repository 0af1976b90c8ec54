-- Claim an Idempotency-Key (api.idempotency.idempotency_claim): one statement, one
-- round trip. The key's row is made in_progress for this request, unless a row of the
-- key exists and has not expired: then nothing is returned, and the caller reads the row
-- it collided with. An expired row (an abandoned claim, a stored response past its time)
-- is taken over in place; its `created_at`, the claim's time, then says whose claim it
-- is, so that the request that held it before cannot complete or release it any more.
-- %(organization)s, %(method)s, %(path)s, %(key)s, %(fingerprint)s, %(now)s, %(lease)s
-- (when the claim stops counting).
INSERT INTO api_idempotencyrecord AS record
    (organization_id, method, path, key, fingerprint, status, created_at, expires_at)
VALUES
    (%(organization)s, %(method)s, %(path)s, %(key)s, %(fingerprint)s, 'in_progress',
     %(now)s, %(lease)s)
ON CONFLICT (organization_id, method, path, key) DO UPDATE
SET fingerprint = EXCLUDED.fingerprint, status = 'in_progress', response_status = NULL,
    response_body = NULL, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
WHERE record.expires_at <= EXCLUDED.created_at
RETURNING id
