-- billing.run_credits: a run's credits over all its attempts (one reservation each):
-- reserved, charged, refunded, and held (reserved but neither charged nor refunded yet,
-- while the reservation is not settled); zeros for a run never started.
--
-- What the API's runs and the run page show (runs/queries/run_read.sql,
-- runs_by_status.sql, page_credits.sql): written once, and a plain SQL function, so that
-- the planner inlines it into the statement that calls it (a LATERAL join per run).
CREATE FUNCTION billing.run_credits(p_run uuid)
RETURNS TABLE (reserved numeric, charged numeric, refunded numeric, held numeric)
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(sum(reserved), 0), COALESCE(sum(charged), 0), COALESCE(sum(refunded), 0),
           COALESCE(sum(reserved - charged - refunded) FILTER (WHERE settled_at IS NULL), 0)
    FROM billing_reservation
    WHERE run_id = p_run
$$;
