-- The active API key of a hash, with its organization (billing.services.
-- api_key_authenticate): one statement on the key_hash index, every request's first.
-- Every column of both rows, the key's then the organization's, parted by the column
-- named "|" (common.queries.instances makes each row's model from its side). %(hash)s.
SELECT k.*, NULL AS "|", o.*
FROM billing_apikey k
JOIN billing_organization o ON o.id = k.organization_id
WHERE k.key_hash = %(hash)s AND k.revoked_at IS NULL
