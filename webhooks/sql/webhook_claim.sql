-- The run webhooks' claim (webhooks.services.deliveries_claim and deliveries_next_due,
-- docs/webhooks.md "Fairness"): which pending deliveries may be sent, and the fair choice
-- among those that are due.

-- The pending deliveries a sweep may send when their time comes: an enabled endpoint's
-- (a test ping, `webhook.test` (webhooks.models.TEST_EVENT), goes to a disabled one too),
-- of an organization that is not suspended (its deliveries are held, pending, until it
-- is unsuspended), and a run's deliveries to an endpoint in order: none while an earlier
-- one of the same run to the same endpoint is pending.
-- With each, its organization's own quota of deliveries in flight (null: the setting's).
CREATE FUNCTION webhooks.webhook_sendable()
RETURNS TABLE (id bigint, endpoint_id uuid, organization_id uuid,
               next_attempt_at timestamptz, lease_until timestamptz,
               organization_quota integer)
LANGUAGE sql STABLE AS $$
    SELECT d.id, d.endpoint_id, e.organization_id, d.next_attempt_at, d.lease_until,
           o.quota_webhooks_in_flight
    FROM webhooks_webhookdelivery AS d
    JOIN webhooks_webhookendpoint AS e ON e.id = d.endpoint_id
    JOIN billing_organization AS o ON o.id = e.organization_id
    WHERE d.status = 'pending'
      AND (e.enabled OR d.event_type = 'webhook.test')
      AND o.suspended_at IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM webhooks_webhookdelivery AS p
          WHERE p.endpoint_id = d.endpoint_id AND p.run_id = d.run_id
            AND p.status = 'pending' AND p.id < d.id)
$$;

-- When a sweep next finds a delivery to claim (null: none): a delivery is due at its
-- next attempt, or when the lease of the claim that holds it ends (GREATEST ignores a
-- null). One held back only by its endpoint's or its organization's in-flight bound
-- counts as due.
CREATE FUNCTION webhooks.webhook_next_due() RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(GREATEST(s.next_attempt_at, s.lease_until)) FROM webhooks.webhook_sendable() AS s
$$;

-- Claim up to p_limit due deliveries, each under a lease of p_lease_s seconds and a fresh
-- token; return them. Fair in three ways, all inside this one query (never a LIMIT first
-- and a filter after, which let held endpoints fill the batch):
--   * an endpoint gets at most p_per_endpoint in flight: the deliveries whose lease runs
--     count, and only its earliest due ones fill its free places (a slow or hanging
--     receiver holds its own places, never the batch);
--   * an organization gets at most its quota in flight, across its endpoints (its own
--     quota_webhooks_in_flight, else p_per_organization: QUOTA_WEBHOOKS_IN_FLIGHT):
--     its turns beyond its free places are left pending, so that its tarpits, however
--     many endpoints they are, hold that many of the sending threads and no more;
--   * organizations take turns: each organization's first delivery (across its endpoints
--     first) comes before any organization's second, and so on; within a turn, the
--     longest due first. One organization's backlog, slow receivers or test flood never
--     keeps another's delivery out of a sweep (unless more than p_limit organizations
--     are due at once: then the ones waiting longest go first, the rest in the next).
-- One claim at a time: a transaction advisory lock ("whks"), held until the caller
-- commits; a sweep that finds it taken claims nothing (the holder claims for both), so
-- the bound counts every claim made before. A delivery another transaction holds (an
-- attempt being recorded, a redelivery) is skipped, left to the next sweep.
CREATE FUNCTION webhooks.webhook_claim(p_limit integer, p_per_endpoint integer,
                                     p_per_organization integer, p_lease_s double precision)
RETURNS TABLE (delivery_id bigint, token uuid) LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(2003331955) THEN  -- 0x77686B73
        RETURN;
    END IF;
    RETURN QUERY
    WITH due AS (
        SELECT s.id, s.endpoint_id, s.organization_id, s.next_attempt_at,
               coalesce(s.organization_quota, p_per_organization) AS organization_quota,
               row_number() OVER (PARTITION BY s.endpoint_id
                                  ORDER BY s.next_attempt_at, s.id) AS place
        FROM webhooks.webhook_sendable() AS s
        WHERE s.next_attempt_at <= clock_timestamp()
          AND (s.lease_until IS NULL OR s.lease_until < clock_timestamp())
    ), in_flight AS (
        SELECT f.endpoint_id, e.organization_id, count(*) AS sending
        FROM webhooks_webhookdelivery AS f
        JOIN webhooks_webhookendpoint AS e ON e.id = f.endpoint_id
        WHERE f.status = 'pending' AND f.lease_until >= clock_timestamp()
          AND e.organization_id IN (SELECT due.organization_id FROM due)
        GROUP BY f.endpoint_id, e.organization_id
    ), organization_in_flight AS (
        SELECT in_flight.organization_id, sum(in_flight.sending) AS sending
        FROM in_flight GROUP BY in_flight.organization_id
    ), fits AS (
        SELECT due.id, due.next_attempt_at, due.organization_id, due.organization_quota,
               row_number() OVER (PARTITION BY due.organization_id
                                  ORDER BY due.place, due.next_attempt_at, due.id) AS turn
        FROM due LEFT JOIN in_flight ON in_flight.endpoint_id = due.endpoint_id
        WHERE due.place <= p_per_endpoint - coalesce(in_flight.sending, 0)
    ), chosen AS (
        SELECT fits.id FROM fits
        LEFT JOIN organization_in_flight AS o ON o.organization_id = fits.organization_id
        WHERE fits.turn <= fits.organization_quota - coalesce(o.sending, 0)
        ORDER BY fits.turn, fits.next_attempt_at, fits.id
        LIMIT p_limit
    ), free AS (
        SELECT w.id FROM webhooks_webhookdelivery AS w
        WHERE w.id IN (SELECT chosen.id FROM chosen) AND w.status = 'pending'
        FOR UPDATE SKIP LOCKED
    )
    UPDATE webhooks_webhookdelivery AS w
    SET lease_until = clock_timestamp() + make_interval(secs => p_lease_s),
        lease_token = gen_random_uuid()
    FROM free
    WHERE w.id = free.id
    RETURNING w.id, w.lease_token;
END
$$;
