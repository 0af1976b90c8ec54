-- How long a row's state lasted when it ends at p_now: from its start (its creation when
-- it never started), in whole milliseconds, never negative. The one rule every ending
-- writes into duration_ms: the functions here, and runs.transitions' UPDATEs, which call
-- it for every row they end (the copy a caller holds reads it back). A SQL function of
-- one expression: PostgreSQL inlines it.
CREATE FUNCTION runs.duration_ms(p_now timestamptz, p_started timestamptz,
                                   p_created timestamptz)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT GREATEST(0, floor(EXTRACT(EPOCH FROM (p_now - COALESCE(p_started, p_created)))
                             * 1000))::bigint
$$;
