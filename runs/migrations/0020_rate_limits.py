"""Rate limits (docs/rate-limits.md): a run whose plan spends them, a step's rate limits
and why it waits; the hot path's function anew, its claims returning the step's rate
limits (``runs.transitions``: a worker checks them before it runs the step). Printed by
``manage.py engine_function``; the reverse restores 0019's definition."""

import importlib

from django.db import migrations, models

PREVIOUS = importlib.import_module("runs.migrations.0019_engine_leaf_recording").CREATE

CREATE = r"""
CREATE FUNCTION engine_step_completed(a_step bigint, a_attempt integer, a_run uuid, a_output text, a_cost numeric, a_cost_text text, a_amount numeric, a_claim boolean, a_worker text, a_task_id text, a_lease float8, a_choose boolean, a_me text, a_full uuid[], a_skip uuid[], a_held uuid)
RETURNS TABLE (o_shape text, o_priority smallint, o_done bigint, o_id bigint, o_tool varchar, o_timeout_ms bigint, o_run_id uuid, o_attempt_number smallint, o_status varchar, o_claimed jsonb)
LANGUAGE plpgsql VOLATILE AS $engine$
DECLARE
    a_organization uuid;
    a_priority smallint;
    a_charge_id uuid := gen_random_uuid();
    a_settle_id uuid := gen_random_uuid();
    a_charge_key text := 'charge:' || a_step || ':' || a_attempt;
    a_settle_reason text;
    a_beat boolean;
    a_now timestamptz;
    v_status text;
    v_waiting integer;
    v_attempt integer;
    v_heartbeat timestamptz;
    v_task bigint;
    v_agent bigint;
    v_open integer;
    v_claim_run uuid;
    v_chosen uuid;
    v_chosen_org uuid;
    v_chosen_priority smallint;
    v_chosen_pickup boolean;
    v_chosen_busy bigint;
    v_recorded boolean := false;
    v_locking timestamptz;
    v_leaf boolean;
    v_done bigint;
    v_claimed jsonb;
    v_drawn bigint;
    v_locked timestamptz;
BEGIN
    -- The run's gate, shared: other recordings of the run go on beside this one;
    -- anything else that changes the run holds it exclusively (runs.transitions).
    PERFORM pg_advisory_xact_lock_shared(1734440037, hashtext(a_run::text));
    SELECT r.status, r.waiting_approvals, r.organization_id, r.attempt_number,
           r.last_heartbeat, r.priority
      INTO v_status, v_waiting, a_organization, v_attempt, v_heartbeat, a_priority
      FROM runs_run AS r WHERE r.id = a_run;
    IF NOT FOUND OR v_status <> 'running' OR v_waiting > 0 THEN
        RETURN;
    END IF;
    -- The step, running this attempt (only an exclusive holder of the gate changes a
    -- running step, and none is in), and no on_error handler; whether it is a leaf of a
    -- task whose steps all run at once (_LEAF). Its row is locked first, before any
    -- other: a claim may hold it (a lock that outlived the claim's recheck), and such a
    -- claim may be waiting for a task's row; so no recording waits for its own step
    -- while it holds one.
    SELECT s.task_id, t.agent_id,
           s.dependents = '[]'::jsonb AND t.max_concurrent_steps >= t.step_count
           AND t.open_children > 1
      INTO v_task, v_agent, v_leaf
      FROM runs_step AS s JOIN runs_task AS t ON t.id = s.task_id
     WHERE s.id = a_step AND s.run_id = a_run AND s.status = 'running'
       AND s.attempts = a_attempt AND s.handler_for_id IS NULL
       FOR NO KEY UPDATE OF s;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- The worker's fair choice, when its slice is over (runs.scheduling), made before
    -- any row lock is taken and returned whatever it is: the run whose next step is
    -- claimed below, when it is of the worker's slot's organization and running; none
    -- when it is another organization's or a pick-up (the worker goes there); this
    -- run's when nothing was ready (what the recording makes ready may be).
    IF a_claim THEN
        v_claim_run := a_run;
        IF a_choose THEN
            SELECT c.org, c.id, c.priority, c.pickup, c.busy
              INTO v_chosen_org, v_chosen, v_chosen_priority, v_chosen_pickup, v_chosen_busy
              FROM (WITH orgs AS (
    SELECT DISTINCT organization_id AS org FROM runs_run
    WHERE status IN ('pending', 'running')
), executing AS (
    -- What the others execute: the asking worker's own slot does not count, or it
    -- would find the organization it serves busier than it is and leave it.
    SELECT organization_id AS org, count(*) AS n FROM runs_stepslot
    WHERE holder <> '' AND holder <> a_me AND expires_at >= now()
    GROUP BY organization_id
), best AS (
    SELECT orgs.org, b.id, b.priority, b.created_at, b.pickup
    FROM orgs CROSS JOIN LATERAL (
        SELECT r.id, r.priority, r.created_at, r.status = 'pending' AS pickup
        FROM runs_run AS r
        WHERE r.organization_id = orgs.org
          AND r.status IN ('pending', 'running', 'waiting_approval', 'paused', 'resuming',
                           'escalated')
          AND r.id <> ALL (a_skip::uuid[])
          AND (
              (r.status = 'pending' AND r.queued_reason = '')
              -- Its first claimable step, in the order of the partial index that holds
              -- them (step_claimable): as EXISTS, a plan that filtered the whole step
              -- table for the run's rows cost a third of a second.
              OR (r.status = 'running' AND (
                  SELECT s.id FROM runs_step AS s
                  WHERE s.run_id = r.id AND s.status = 'pending'
                    AND s.dispatched_at IS NOT NULL
                    AND (s.next_run_at IS NULL OR s.next_run_at <= now())
                  ORDER BY s.run_id, s.id
                  LIMIT 1
              ) IS NOT NULL)
          )
        ORDER BY r.priority, r.created_at, r.id
        LIMIT 1
    ) AS b
    WHERE orgs.org <> ALL (a_full::uuid[])
), choice AS (
    -- busy: the other workers executing the chosen organization's steps (a worker
    -- serving it looks again less often the more they are: ``Choice.busy``)
    SELECT best.org, best.id, best.priority, best.pickup, COALESCE(executing.n, 0) AS busy
    FROM best
    JOIN billing_organization AS o ON o.id = best.org
    LEFT JOIN executing ON executing.org = best.org
    LEFT JOIN runs_fairturn AS turn ON turn.organization_id = best.org
    ORDER BY COALESCE(executing.n, 0)::float / GREATEST(o.share, 1), turn.served_at NULLS FIRST,
             best.priority, best.created_at, best.id
    LIMIT 1
)
SELECT org, id, priority, pickup, busy FROM choice) AS c;
            RETURN QUERY SELECT 'chosen'::text, v_chosen_priority, NULL::bigint,
                NULL::bigint, NULL::varchar, NULL::bigint, v_chosen, NULL::smallint,
                NULL::varchar,
                jsonb_build_object('organization_id', v_chosen_org, 'pickup', v_chosen_pickup,
                                   'busy', v_chosen_busy);
            IF v_chosen IS NULL THEN
                v_claim_run := a_run;
            ELSIF v_chosen_pickup OR v_chosen_org IS DISTINCT FROM a_held THEN
                v_claim_run := NULL;
            ELSE
                v_claim_run := v_chosen;
            END IF;
        END IF;
    END IF;
    a_settle_reason := 'settled run ' || a_run || ' attempt ' || v_attempt;
    -- A leaf (_LEAF): the step completed and the next one claimed first, then the task's
    -- row locked for its counters alone, then the charge. The task's last leaf finds one
    -- child open there: the block is rolled back, its writes and row locks with it, and
    -- the shapes below record the step; so is a charge the reservation cannot pay.
    IF v_leaf THEN
        a_now := clock_timestamp();
        BEGIN
            WITH task AS (
    SELECT t.id
    FROM runs_task AS t JOIN runs_step AS s ON s.task_id = t.id
    WHERE s.id = a_step AND s.status = 'running' AND s.attempts = a_attempt
      AND s.handler_for_id IS NULL
      AND t.id = (SELECT task_id FROM runs_step WHERE id = a_step) AND t.status = 'running' AND t.open_children > 1
      AND s.dependents = '[]'::jsonb AND t.max_concurrent_steps >= t.step_count
), done AS (
    UPDATE runs_step AS s
    SET status = 'completed',
        status_changed_at = a_now,
        completed_at = a_now,
        duration_ms = GREATEST(0, floor(EXTRACT(EPOCH FROM
            (a_now::timestamptz - COALESCE(s.started_at, s.created_at))) * 1000))::bigint,
        output = a_output::jsonb,
        cost = s.cost + a_cost,
        lease_expires_at = NULL
    FROM task
    WHERE s.id = a_step AND s.task_id = task.id AND s.status = 'running'
      AND s.attempts = a_attempt AND s.handler_for_id IS NULL
    RETURNING s.id, s.run_id, s.attempt_number, s.attempts, s.name, s.dependents
), event AS (
    INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    SELECT run_id, attempt_number, 'step', id::text, 'transition', 'running', 'completed',
           'system', '', jsonb_build_object('cost', a_cost_text::text), a_now
    FROM done
)
SELECT done.id INTO v_done FROM done;
            IF v_done IS NOT NULL THEN
                IF v_claim_run IS NOT NULL THEN
                    WITH next AS (
    SELECT id FROM runs_step
    WHERE run_id = v_claim_run
      AND status = 'pending'
      AND dispatched_at IS NOT NULL
      AND (next_run_at IS NULL OR next_run_at <= a_now)
    -- The order of the partial index step_claimable (run, id): by id alone, a generic
    -- plan read the run's pending steps by another index and sorted them all.
    ORDER BY run_id, id
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE runs_step AS s
    SET status = 'running',
        attempts = s.attempts + 1,
        started_at = COALESCE(s.started_at, a_now),
        status_changed_at = a_now,
        lease_expires_at = a_now + make_interval(secs => a_lease),
        next_run_at = NULL,
        worker = a_worker,
        celery_task_id = a_task_id
    WHERE s.id = (SELECT id FROM next) AND s.run_id = v_claim_run
      AND s.status = 'pending'
      AND s.dispatched_at IS NOT NULL
      AND (s.next_run_at IS NULL OR s.next_run_at <= a_now)
      -- The run by its key: as a join, a generic plan made while few runs were running
      -- scanned every running run for it.
      AND (SELECT r.status FROM runs_run AS r WHERE r.id = s.run_id) = 'running'
    RETURNING s.id, s.run_id, s.attempt_number, s.attempts, s.task_id, s.generation, s.name,
              s.tool, s.params, s."when", s.timeout_ms, s.handler_for_id, s.dispatched_at,
              s.status_changed_at, s.rate_limits
), event AS (
    INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    SELECT run_id, attempt_number, 'step', id::text, 'transition', 'pending', 'running',
           a_worker, '', jsonb_build_object('attempt', attempts), a_now
    FROM claimed
)
SELECT to_jsonb(claimed) || jsonb_build_object('more', EXISTS (
        SELECT 1 FROM runs_step AS other
        WHERE other.run_id = v_claim_run
          AND other.status = 'pending'
          AND other.dispatched_at IS NOT NULL
          AND (other.next_run_at IS NULL OR other.next_run_at <= a_now)
          AND other.id <> claimed.id
    )) INTO v_claimed FROM claimed;
                END IF;
                v_locking := clock_timestamp();
                UPDATE runs_task
                   SET open_children = open_children - 1, active_children = active_children - 1
                 WHERE id = v_task AND status = 'running' AND open_children > 1;
                IF NOT FOUND THEN
                    RAISE EXCEPTION USING ERRCODE = 'OEL01';
                END IF;
                v_locked := clock_timestamp();
                IF a_amount > 0 THEN
                    WITH task AS (
    SELECT s.attempt_number AS step_attempt_number, s.name AS step_name
    FROM runs_step AS s WHERE s.id = a_step
), charge AS (
    SELECT a_charge_id::uuid AS id, a_organization::uuid AS organization_id,
           a_run::uuid AS run_id, task.step_attempt_number AS attempt_number,
           a_step::bigint AS step_id, a_amount::numeric AS amount,
           a_charge_key::text AS key,
           left('step ' || task.step_name || ' attempt ' || a_attempt::text, 500) AS reason,
           'engine'::text AS actor
    FROM task WHERE a_amount::numeric > 0
), 
charge_drawn AS (
    UPDATE billing_reservation AS r SET charged = r.charged + charge.amount
    FROM charge
    WHERE r.run_id = charge.run_id AND r.attempt_number = charge.attempt_number
      AND r.settled_at IS NULL
      AND r.reserved - r.charged - r.refunded >= charge.amount
      AND NOT EXISTS (
          SELECT 1 FROM billing_ledgerentry AS l
          WHERE l.organization_id = charge.organization_id AND l.idempotency_key = charge.key
      )
    RETURNING r.attempt_id, r.run_id
), charge_entry AS (
    INSERT INTO billing_ledgerentry
        (id, organization_id, run_id, attempt_id, step_id, type, amount, idempotency_key,
         reason, actor, created_at)
    SELECT charge.id, charge.organization_id, drawn.run_id, drawn.attempt_id, charge.step_id,
           'charge', charge.amount, charge.key, charge.reason, charge.actor, now()
    FROM charge, charge_drawn AS drawn
)
SELECT count(*) INTO v_drawn FROM charge_drawn;
                    IF v_drawn = 0 THEN
                        RAISE EXCEPTION USING ERRCODE = 'OEL01';
                    END IF;
                END IF;
            END IF;
        EXCEPTION WHEN SQLSTATE 'OEL01' THEN
            v_done := NULL;
            v_claimed := NULL;
        END;
        IF v_done IS NOT NULL THEN
            RETURN QUERY SELECT 'in_task'::text, a_priority, v_done, NULL::bigint,
                NULL::varchar, NULL::bigint, NULL::uuid, NULL::smallint, NULL::varchar,
                NULL::jsonb;
            IF v_claimed IS NOT NULL THEN
                RETURN QUERY SELECT 'claimed'::text, NULL::smallint, NULL::bigint,
                    NULL::bigint, NULL::varchar, NULL::bigint, NULL::uuid, NULL::smallint,
                    NULL::varchar,
                    v_claimed || jsonb_build_object('waited',
                                                    EXTRACT(EPOCH FROM v_locked - v_locking));
            END IF;
            IF a_now - COALESCE(v_heartbeat, a_now) > interval '5 seconds' THEN
                UPDATE runs_run SET last_heartbeat = a_now WHERE id = a_run;
            END IF;
            RETURN;
        END IF;
    END IF;
    -- Each level's row locked before its counts are read and its statement runs (the
    -- statement's snapshot then sees every earlier holder's commit): the task's, for
    -- its counters and its steps' dependencies; the agent's when the task ends, for its
    -- counters and its tasks'; the run's when the agent ends. Always in that order.
    v_locking := clock_timestamp();  -- the wait for the locks goes back to the worker
    SELECT open_children INTO v_open FROM runs_task WHERE id = v_task FOR NO KEY UPDATE;
    IF v_open > 1 THEN
        a_now := clock_timestamp();  -- as the general path's, once its locks are held
        RETURN QUERY WITH task AS (
    SELECT t.id, t.retry_count, t.max_concurrent_steps, t.active_children,
           s.attempt_number AS step_attempt_number, s.name AS step_name,
           s.dependents AS step_dependents
    FROM runs_task AS t JOIN runs_step AS s ON s.task_id = t.id
    WHERE s.id = a_step AND s.status = 'running' AND s.attempts = a_attempt
      AND s.handler_for_id IS NULL
      AND t.id = (SELECT task_id FROM runs_step WHERE id = a_step) AND t.status = 'running' AND t.open_children > 1
), released AS (
    -- Read with the task: what the step releases decides what is dispatched, and an
    -- approval among that is the general path's (there the run may stop to wait for
    -- it), so the charge and the step's completion depend on it.
    SELECT jsonb_array_elements_text(task.step_dependents) AS name FROM task
), siblings AS (
    -- The successors this step releases (by name: the unique index of a task's steps)...
    SELECT st.id, st.position, st.status, st.dispatched_at, st.pending_dependencies AS pending,
           st.handler_for_id IS NULL AS released
    FROM released, task, LATERAL (
        SELECT * FROM runs_step
        WHERE task_id = task.id AND generation = task.retry_count AND name = released.name
        OFFSET 0  -- not flattened: one unique-index probe per name, whatever the estimates
    ) AS st
    UNION
    -- ...and the steps already ready but held by the concurrency limit, first ones first
    -- (the partial index step_ready covers exactly these rows, so a wide task costs what
    -- a narrow one does).
    SELECT * FROM (
        SELECT st.id, st.position, st.status, st.dispatched_at,
               st.pending_dependencies AS pending, false AS released
        FROM runs_step AS st
        WHERE st.task_id = (SELECT id FROM task)
          AND st.generation = (SELECT retry_count FROM task)
          AND st.status = 'pending' AND st.pending_dependencies = 0
          AND st.dispatched_at IS NULL
        ORDER BY st.position
        LIMIT (SELECT GREATEST(max_concurrent_steps - (active_children - 1), 0) FROM task)
    ) AS held
), ready AS (
    SELECT id FROM siblings
    WHERE status = 'pending' AND dispatched_at IS NULL
      AND pending - released::int = 0
    ORDER BY position
    LIMIT (SELECT GREATEST(max_concurrent_steps - (active_children - 1), 0) FROM task)
), plain AS (
    SELECT 1 AS ok WHERE NOT EXISTS (
        SELECT 1 FROM runs_step WHERE id IN (SELECT id FROM ready) AND tool = 'approval'
    )
), charge AS (
    SELECT a_charge_id::uuid AS id, a_organization::uuid AS organization_id,
           a_run::uuid AS run_id, task.step_attempt_number AS attempt_number,
           a_step::bigint AS step_id, a_amount::numeric AS amount,
           a_charge_key::text AS key,
           left('step ' || task.step_name || ' attempt ' || a_attempt::text, 500) AS reason,
           'engine'::text AS actor
    FROM task WHERE a_amount::numeric > 0 AND EXISTS (SELECT 1 FROM plain)
), 
charge_drawn AS (
    UPDATE billing_reservation AS r SET charged = r.charged + charge.amount
    FROM charge
    WHERE r.run_id = charge.run_id AND r.attempt_number = charge.attempt_number
      AND r.settled_at IS NULL
      AND r.reserved - r.charged - r.refunded >= charge.amount
      AND NOT EXISTS (
          SELECT 1 FROM billing_ledgerentry AS l
          WHERE l.organization_id = charge.organization_id AND l.idempotency_key = charge.key
      )
    RETURNING r.attempt_id, r.run_id
), charge_entry AS (
    INSERT INTO billing_ledgerentry
        (id, organization_id, run_id, attempt_id, step_id, type, amount, idempotency_key,
         reason, actor, created_at)
    SELECT charge.id, charge.organization_id, drawn.run_id, drawn.attempt_id, charge.step_id,
           'charge', charge.amount, charge.key, charge.reason, charge.actor, now()
    FROM charge, charge_drawn AS drawn
), done AS (
    UPDATE runs_step AS s
    SET status = 'completed',
        status_changed_at = a_now,
        completed_at = a_now,
        duration_ms = GREATEST(0, floor(EXTRACT(EPOCH FROM
            (a_now::timestamptz - COALESCE(s.started_at, s.created_at))) * 1000))::bigint,
        output = a_output::jsonb,
        cost = s.cost + a_cost,
        lease_expires_at = NULL
    FROM task
    WHERE EXISTS (SELECT 1 FROM plain) AND (NOT EXISTS (SELECT 1 FROM charge) OR EXISTS (SELECT 1 FROM charge_drawn)) AND s.id = a_step AND s.task_id = task.id AND s.status = 'running'
      AND s.attempts = a_attempt AND s.handler_for_id IS NULL
    RETURNING s.id, s.run_id, s.attempt_number, s.attempts, s.name, s.dependents
), event AS (
    INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    SELECT run_id, attempt_number, 'step', id::text, 'transition', 'running', 'completed',
           'system', '', jsonb_build_object('cost', a_cost_text::text), a_now
    FROM done
), moved AS (
    -- The ids as the one index condition, never a join: joined on ``siblings``
    -- (estimated at a hundred rows: a set-returning function's default) it scanned the
    -- whole step table while that was small, and a nested loop over the ids with the
    -- ids also as an index condition probed every id once per row (quadratic in a wide
    -- start: see _START). What a row needs of its sibling is a hashed subplan each.
    UPDATE runs_step AS st
    SET pending_dependencies = st.pending_dependencies
            - (st.id IN (SELECT id FROM siblings WHERE released))::int,
        dispatched_at = CASE WHEN st.id IN (SELECT id FROM ready) THEN a_now
                             ELSE st.dispatched_at END
    WHERE st.id = ANY (ARRAY(SELECT id FROM siblings
                             WHERE released OR id IN (SELECT id FROM ready)))
      AND EXISTS (SELECT 1 FROM done)
    RETURNING st.id, st.tool, st.timeout_ms, st.run_id, st.attempt_number, st.status,
              st.position, st.id IN (SELECT id FROM ready) AS dispatched
), counted AS (
    UPDATE runs_task AS t
    SET open_children = t.open_children - 1,
        active_children = t.active_children - 1 + (SELECT count(*) FROM ready)
    FROM done
    WHERE t.id = (SELECT id FROM task)
)
SELECT 'in_task'::text, a_priority::smallint, done.id,
       moved.id, moved.tool, moved.timeout_ms, moved.run_id, moved.attempt_number,
       moved.status, NULL::jsonb
FROM done LEFT JOIN moved ON moved.dispatched
ORDER BY moved.position;
        v_recorded := FOUND;
    ELSE
        SELECT open_children INTO v_open FROM runs_agent WHERE id = v_agent
           FOR NO KEY UPDATE;
        IF v_open > 1 THEN
            a_now := clock_timestamp();  -- as the general path's, once its locks are held
            RETURN QUERY WITH task AS (
    SELECT t.id, t.agent_id, t.retry_count, t.dependents,
           s.attempt_number AS step_attempt_number, s.name AS step_name
    FROM runs_task AS t JOIN runs_step AS s ON s.task_id = t.id
    WHERE s.id = a_step AND s.status = 'running' AND s.attempts = a_attempt
      AND s.handler_for_id IS NULL
      AND t.id = (SELECT task_id FROM runs_step WHERE id = a_step) AND t.status = 'running' AND t.open_children = 1
), agent AS (
    SELECT a.id, a.retry_count, a.active_children,
           GREATEST(a.max_concurrent_tasks - (a.active_children - 1), 0) AS free
    FROM runs_agent AS a, task
    WHERE a.id = task.agent_id AND a.status = 'running' AND a.open_children > 1
), released AS (
    SELECT jsonb_array_elements_text(task.dependents) AS name FROM task
), siblings AS (
    SELECT tk.id, tk.position, tk.status, tk.dispatched_at, tk.pending_dependencies AS pending,
           true AS released
    FROM released, agent, LATERAL (
        SELECT * FROM runs_task
        WHERE agent_id = agent.id AND generation = agent.retry_count AND name = released.name
        OFFSET 0  -- one unique-index probe per name
    ) AS tk
    UNION
    SELECT * FROM (
        SELECT tk.id, tk.position, tk.status, tk.dispatched_at,
               tk.pending_dependencies AS pending, false AS released
        FROM runs_task AS tk
        WHERE tk.agent_id = (SELECT id FROM agent)
          AND tk.generation = (SELECT retry_count FROM agent)
          AND tk.status = 'pending' AND tk.pending_dependencies = 0
          AND tk.dispatched_at IS NULL
        ORDER BY tk.position
        LIMIT (SELECT free FROM agent)
    ) AS held
), ready AS (
    SELECT id FROM siblings
    WHERE status = 'pending' AND dispatched_at IS NULL AND pending - released::int = 0
    ORDER BY position
    LIMIT (SELECT free FROM agent)
), new_steps AS (
    -- Each ready task's first steps, looked up by its id (an index condition the
    -- planner estimates well): joined on ``ready``, or given the ids as an array, a plan
    -- made under statistics that counted many steps pending read the whole step table
    -- (seen in a full test session).
    SELECT st.id, st.task_id, st.position, st.tool
    FROM ready
    JOIN runs_task AS tk ON tk.id = ready.id
    CROSS JOIN LATERAL (
        SELECT s.id, s.task_id, s.position, s.tool FROM runs_step AS s
        WHERE s.task_id = tk.id AND s.generation = tk.retry_count
          AND s.status = 'pending' AND s.pending_dependencies = 0
          AND s.dispatched_at IS NULL
        ORDER BY s.position
        LIMIT GREATEST(tk.max_concurrent_steps - tk.active_children, 0)
    ) AS st
), charge AS (
    SELECT a_charge_id::uuid AS id, a_organization::uuid AS organization_id,
           a_run::uuid AS run_id, task.step_attempt_number AS attempt_number,
           a_step::bigint AS step_id, a_amount::numeric AS amount,
           a_charge_key::text AS key,
           left('step ' || task.step_name || ' attempt ' || a_attempt::text, 500) AS reason,
           'engine'::text AS actor
    FROM task, agent
    WHERE a_amount::numeric > 0 AND NOT EXISTS (SELECT 1 FROM new_steps WHERE tool = 'approval')
), 
charge_drawn AS (
    UPDATE billing_reservation AS r SET charged = r.charged + charge.amount
    FROM charge
    WHERE r.run_id = charge.run_id AND r.attempt_number = charge.attempt_number
      AND r.settled_at IS NULL
      AND r.reserved - r.charged - r.refunded >= charge.amount
      AND NOT EXISTS (
          SELECT 1 FROM billing_ledgerentry AS l
          WHERE l.organization_id = charge.organization_id AND l.idempotency_key = charge.key
      )
    RETURNING r.attempt_id, r.run_id
), charge_entry AS (
    INSERT INTO billing_ledgerentry
        (id, organization_id, run_id, attempt_id, step_id, type, amount, idempotency_key,
         reason, actor, created_at)
    SELECT charge.id, charge.organization_id, drawn.run_id, drawn.attempt_id, charge.step_id,
           'charge', charge.amount, charge.key, charge.reason, charge.actor, now()
    FROM charge, charge_drawn AS drawn
), done AS (
    UPDATE runs_step AS s
    SET status = 'completed',
        status_changed_at = a_now,
        completed_at = a_now,
        duration_ms = GREATEST(0, floor(EXTRACT(EPOCH FROM
            (a_now::timestamptz - COALESCE(s.started_at, s.created_at))) * 1000))::bigint,
        output = a_output::jsonb,
        cost = s.cost + a_cost,
        lease_expires_at = NULL
    FROM task, agent
    WHERE NOT EXISTS (SELECT 1 FROM new_steps WHERE tool = 'approval') AND (NOT EXISTS (SELECT 1 FROM charge) OR EXISTS (SELECT 1 FROM charge_drawn))
      AND s.id = a_step AND s.task_id = task.id AND s.status = 'running'
      AND s.attempts = a_attempt AND s.handler_for_id IS NULL
    RETURNING s.id, s.run_id, s.attempt_number, s.attempts, s.name, s.dependents
), step_released AS (
    UPDATE runs_step AS st SET pending_dependencies = st.pending_dependencies - 1
    FROM (
        SELECT dependent.id
        FROM done, task, jsonb_array_elements_text(done.dependents) AS released (name),
        LATERAL (
            SELECT id FROM runs_step
            WHERE task_id = task.id AND generation = task.retry_count
              AND name = released.name AND handler_for_id IS NULL
            OFFSET 0
        ) AS dependent
    ) AS rel
    WHERE st.id = rel.id
), finished AS (
    UPDATE runs_task AS t
    SET status = 'completed',
        status_changed_at = a_now,
        completed_at = a_now,
        duration_ms = GREATEST(0, floor(EXTRACT(EPOCH FROM
            (a_now::timestamptz - COALESCE(t.started_at, t.created_at))) * 1000))::bigint,
        open_children = t.open_children - 1,
        active_children = t.active_children - 1
    FROM done
    WHERE t.id = (SELECT id FROM task)
    RETURNING t.id, t.run_id, t.attempt_number
), new_counts AS (
    SELECT task_id, count(*) AS n FROM new_steps GROUP BY task_id
), moved_tasks AS (
    -- The ids as the one index condition, as in _IN_TASK's ``moved``.
    UPDATE runs_task AS tk
    SET pending_dependencies = tk.pending_dependencies
            - (tk.id IN (SELECT id FROM siblings WHERE released))::int,
        status = CASE WHEN tk.id IN (SELECT id FROM ready) THEN 'running' ELSE tk.status END,
        status_changed_at = CASE WHEN tk.id IN (SELECT id FROM ready) THEN a_now
                                 ELSE tk.status_changed_at END,
        started_at = CASE WHEN tk.id IN (SELECT id FROM ready)
                          THEN COALESCE(tk.started_at, a_now) ELSE tk.started_at END,
        dispatched_at = CASE WHEN tk.id IN (SELECT id FROM ready) THEN a_now
                             ELSE tk.dispatched_at END,
        active_children = tk.active_children
            + COALESCE((SELECT n FROM new_counts WHERE new_counts.task_id = tk.id), 0)
    WHERE tk.id = ANY (ARRAY(SELECT id FROM siblings
                             WHERE released OR id IN (SELECT id FROM ready)))
      AND EXISTS (SELECT 1 FROM done)
    RETURNING tk.id, tk.run_id, tk.attempt_number, tk.position,
              tk.id IN (SELECT id FROM ready) AS started
), moved_steps AS (
    UPDATE runs_step AS st SET dispatched_at = a_now
    WHERE st.id = ANY (ARRAY(SELECT id FROM new_steps)) AND EXISTS (SELECT 1 FROM done)
    RETURNING st.id, st.tool, st.timeout_ms, st.run_id, st.attempt_number, st.status,
              st.task_id, st.position
), agent_counted AS (
    UPDATE runs_agent AS a
    SET open_children = a.open_children - 1,
        active_children = a.active_children - 1 + (SELECT count(*) FROM ready)
    FROM done
    WHERE a.id = (SELECT id FROM agent)
), event AS (
    INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    SELECT run_id, attempt_number, entity, entity_id, 'transition', from_status, to_status,
           'system', '', payload, a_now
    FROM (
        SELECT 0 AS k, 0::bigint AS o, run_id, attempt_number, 'step' AS entity,
               id::text AS entity_id, 'running' AS from_status, 'completed' AS to_status,
               jsonb_build_object('cost', a_cost_text::text) AS payload
        FROM done
        UNION ALL
        SELECT 1, 0, run_id, attempt_number, 'task', id::text, 'running', 'completed',
               '{}'::jsonb
        FROM finished
        UNION ALL
        SELECT 2, id, run_id, attempt_number, 'task', id::text, 'pending', 'running',
               '{}'::jsonb
        FROM moved_tasks WHERE started
    ) AS e
    ORDER BY k, o
)
SELECT 'last_in_task'::text, a_priority::smallint, done.id,
       moved.id, moved.tool, moved.timeout_ms, moved.run_id, moved.attempt_number,
       moved.status, NULL::jsonb
FROM done
LEFT JOIN (
    SELECT moved_steps.*, moved_tasks.position AS task_position
    FROM moved_steps JOIN moved_tasks ON moved_tasks.id = moved_steps.task_id
) AS moved ON true
ORDER BY moved.task_position, moved.position;
            v_recorded := FOUND;
        ELSE
            SELECT open_children INTO v_open FROM runs_run WHERE id = a_run
               FOR NO KEY UPDATE;
            IF v_open = 1 THEN
                a_now := clock_timestamp();  -- as the general path's, once its locks are held
                a_beat := a_now - COALESCE(v_heartbeat, a_now) > interval '5 seconds';
                RETURN QUERY WITH task AS (
    SELECT t.id, t.agent_id, t.retry_count, t.dependents,
           s.attempt_number AS step_attempt_number, s.name AS step_name
    FROM runs_task AS t JOIN runs_step AS s ON s.task_id = t.id
    WHERE s.id = a_step AND s.status = 'running' AND s.attempts = a_attempt
      AND s.handler_for_id IS NULL
      AND t.id = (SELECT task_id FROM runs_step WHERE id = a_step) AND t.status = 'running' AND t.open_children = 1
), agent AS (
    SELECT a.id, a.run_id, a.attempt_number, a.retry_count, a.dependents
    FROM runs_agent AS a, task
    WHERE a.id = task.agent_id AND a.status = 'running' AND a.open_children = 1
      AND NOT EXISTS (
          SELECT 1 FROM runs_agent AS other
          WHERE other.run_id = a.run_id AND other.attempt_number = a.attempt_number
            AND other.id <> a.id AND other.status NOT IN ('completed', 'skipped')
      )
), run AS (
    SELECT r.id FROM runs_run AS r, agent
    WHERE r.id = a_run AND r.id = agent.run_id AND r.status = 'running'
      AND r.open_children = 1 AND r.waiting_approvals = 0
), charge AS (
    SELECT a_charge_id::uuid AS id, a_organization::uuid AS organization_id,
           a_run::uuid AS run_id, task.step_attempt_number AS attempt_number,
           a_step::bigint AS step_id, a_amount::numeric AS amount,
           a_charge_key::text AS key,
           left('step ' || task.step_name || ' attempt ' || a_attempt::text, 500) AS reason,
           'engine'::text AS actor
    FROM task, run WHERE a_amount::numeric > 0
), settle AS (
    SELECT run.id AS run_id, agent.attempt_number, a_settle_reason::text AS reason,
           'engine'::text AS actor
    FROM run, agent
), 
settle_held AS (
    SELECT r.id, r.attempt_id, r.organization_id, r.run_id,
           r.reserved - r.charged - r.refunded - COALESCE((SELECT amount FROM charge), 0)
               AS refund
    FROM billing_reservation AS r, settle
    WHERE r.run_id = settle.run_id AND r.attempt_number = settle.attempt_number
      AND r.settled_at IS NULL
      AND r.reserved - r.charged - r.refunded >= COALESCE((SELECT amount FROM charge), 0)
      AND NOT EXISTS (
          SELECT 1 FROM billing_ledgerentry AS l, charge
          WHERE l.organization_id = charge.organization_id AND l.idempotency_key = charge.key
      )
), settle_drawn AS (
    UPDATE billing_reservation AS r
    SET charged = r.charged + COALESCE((SELECT amount FROM charge), 0),
        refunded = r.refunded + held.refund,
        settled_at = now()
    FROM settle_held AS held
    WHERE r.id = held.id
    RETURNING r.id
), settle_charge_entry AS (
    INSERT INTO billing_ledgerentry
        (id, organization_id, run_id, attempt_id, step_id, type, amount, idempotency_key,
         reason, actor, created_at)
    SELECT charge.id, charge.organization_id, held.run_id, held.attempt_id, charge.step_id,
           'charge', charge.amount, charge.key, charge.reason, charge.actor, now()
    FROM charge, settle_held AS held
    WHERE EXISTS (SELECT 1 FROM settle_drawn)
), settle_entry AS (
    INSERT INTO billing_ledgerentry
        (id, organization_id, run_id, attempt_id, step_id, type, amount, idempotency_key,
         reason, actor, created_at)
    SELECT a_settle_id::uuid, held.organization_id, held.run_id, held.attempt_id, NULL,
           'refund', held.refund, 'refund:' || held.attempt_id::text, settle.reason,
           settle.actor, now()
    FROM settle_held AS held, settle
    WHERE held.refund > 0 AND EXISTS (SELECT 1 FROM settle_drawn)
    RETURNING amount
), settle_returned AS (
    UPDATE billing_organization AS o SET credits_available = o.credits_available + held.refund
    FROM settle_held AS held
    WHERE o.id = held.organization_id AND held.refund > 0
      AND EXISTS (SELECT 1 FROM settle_drawn)
), done AS (
    UPDATE runs_step AS s
    SET status = 'completed',
        status_changed_at = a_now,
        completed_at = a_now,
        duration_ms = GREATEST(0, floor(EXTRACT(EPOCH FROM
            (a_now::timestamptz - COALESCE(s.started_at, s.created_at))) * 1000))::bigint,
        output = a_output::jsonb,
        cost = s.cost + a_cost,
        lease_expires_at = NULL
    FROM task
    WHERE EXISTS (SELECT 1 FROM settle_drawn) AND s.id = a_step AND s.task_id = task.id AND s.status = 'running'
      AND s.attempts = a_attempt AND s.handler_for_id IS NULL
    RETURNING s.id, s.run_id, s.attempt_number, s.attempts, s.name, s.dependents
), step_released AS (
    UPDATE runs_step AS st SET pending_dependencies = st.pending_dependencies - 1
    FROM (
        SELECT dependent.id
        FROM done, task, jsonb_array_elements_text(done.dependents) AS released (name),
        LATERAL (
            SELECT id FROM runs_step
            WHERE task_id = task.id AND generation = task.retry_count
              AND name = released.name AND handler_for_id IS NULL
            OFFSET 0
        ) AS dependent
    ) AS rel
    WHERE st.id = rel.id
), finished AS (
    UPDATE runs_task AS t
    SET status = 'completed',
        status_changed_at = a_now,
        completed_at = a_now,
        duration_ms = GREATEST(0, floor(EXTRACT(EPOCH FROM
            (a_now::timestamptz - COALESCE(t.started_at, t.created_at))) * 1000))::bigint,
        open_children = t.open_children - 1,
        active_children = t.active_children - 1
    FROM done
    WHERE t.id = (SELECT id FROM task)
    RETURNING t.id, t.run_id, t.attempt_number
), task_released AS (
    UPDATE runs_task AS tk SET pending_dependencies = tk.pending_dependencies - 1
    FROM agent
    WHERE tk.agent_id = agent.id AND tk.generation = agent.retry_count
      AND tk.name IN (SELECT jsonb_array_elements_text(task.dependents) FROM task)
      AND EXISTS (SELECT 1 FROM done)
), agent_finished AS (
    UPDATE runs_agent AS t
    SET status = 'completed',
        status_changed_at = a_now,
        completed_at = a_now,
        duration_ms = GREATEST(0, floor(EXTRACT(EPOCH FROM
            (a_now::timestamptz - COALESCE(t.started_at, t.created_at))) * 1000))::bigint,
        open_children = t.open_children - 1,
        active_children = t.active_children - 1
    FROM done
    WHERE t.id = (SELECT id FROM agent)
    RETURNING t.id, t.run_id, t.attempt_number
), agent_released AS (
    UPDATE runs_agent AS ag SET pending_dependencies = ag.pending_dependencies - 1
    FROM agent
    WHERE ag.run_id = agent.run_id AND ag.attempt_number = agent.attempt_number
      AND ag.name IN (SELECT jsonb_array_elements_text(agent.dependents) FROM agent)
      AND EXISTS (SELECT 1 FROM done)
), run_finished AS (
    UPDATE runs_run AS r
    SET status = 'completed',
        status_changed_at = a_now,
        completed_at = a_now,
        duration_ms = GREATEST(0, floor(EXTRACT(EPOCH FROM
            (a_now::timestamptz - COALESCE(r.started_at, r.created_at))) * 1000))::bigint,
        updated_at = a_now,
        open_children = r.open_children - 1,
        active_children = r.active_children - 1,
        last_heartbeat = CASE WHEN a_beat THEN a_now ELSE r.last_heartbeat END
    FROM done
    WHERE r.id = a_run
    RETURNING r.id, r.attempt_number
), attempt_finished AS (
    UPDATE runs_runattempt AS at SET finished_at = a_now, outcome = 'completed'
    FROM run_finished
    WHERE at.run_id = run_finished.id AND at.attempt_number = run_finished.attempt_number
), event AS (
    INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    SELECT run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
           message, payload, a_now
    FROM (
        SELECT 0 AS k, run_id, attempt_number, 'step' AS entity, id::text AS entity_id,
               'transition' AS kind, 'running' AS from_status, 'completed' AS to_status,
               'system' AS actor, '' AS message,
               jsonb_build_object('cost', a_cost_text::text) AS payload
        FROM done
        UNION ALL
        SELECT 1, run_id, attempt_number, 'task', id::text, 'transition', 'running',
               'completed', 'system', '', '{}'::jsonb
        FROM finished
        UNION ALL
        SELECT 2, run_id, attempt_number, 'agent', id::text, 'transition', 'running',
               'completed', 'system', '', '{}'::jsonb
        FROM agent_finished
        UNION ALL
        SELECT 3, id, attempt_number, 'run', id::text, 'transition', 'running', 'completed',
               'engine', '', '{}'::jsonb
        FROM run_finished
        UNION ALL
        SELECT 4, run_finished.id, run_finished.attempt_number, 'run', run_finished.id::text,
               'charge', '', '', 'engine', 'refunded ' || refund.amount::text || ' credits',
               jsonb_build_object('type', 'refund', 'amount', refund.amount::text)
        FROM run_finished, settle_entry AS refund
    ) AS e
    ORDER BY k
)
SELECT 'last_in_run'::text, a_priority::smallint, done.id,
       NULL::bigint, NULL::varchar, NULL::bigint, NULL::uuid, NULL::smallint, NULL::varchar,
       NULL::jsonb
FROM done;
                RETURN;  -- the run's row is updated there, heartbeat included
            END IF;
        END IF;
    END IF;
    IF NOT v_recorded THEN
        RETURN;
    END IF;
    -- The worker's next step, claimed in the same commit, after the recording (what it
    -- made ready may be that step: the next of a sequence, a dag's next node) and under
    -- the recording's row locks: claiming takes a row lock that may outlive a row its
    -- recheck turned down (a step another worker's claim has just taken), and a claim
    -- made before the task's lock was taken held such a step while its own worker,
    -- recording it, waited behind that lock: a deadlock.
    IF v_claim_run IS NOT NULL THEN
        RETURN QUERY WITH next AS (
    SELECT id FROM runs_step
    WHERE run_id = v_claim_run
      AND status = 'pending'
      AND dispatched_at IS NOT NULL
      AND (next_run_at IS NULL OR next_run_at <= a_now)
    -- The order of the partial index step_claimable (run, id): by id alone, a generic
    -- plan read the run's pending steps by another index and sorted them all.
    ORDER BY run_id, id
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE runs_step AS s
    SET status = 'running',
        attempts = s.attempts + 1,
        started_at = COALESCE(s.started_at, a_now),
        status_changed_at = a_now,
        lease_expires_at = a_now + make_interval(secs => a_lease),
        next_run_at = NULL,
        worker = a_worker,
        celery_task_id = a_task_id
    WHERE s.id = (SELECT id FROM next) AND s.run_id = v_claim_run
      AND s.status = 'pending'
      AND s.dispatched_at IS NOT NULL
      AND (s.next_run_at IS NULL OR s.next_run_at <= a_now)
      -- The run by its key: as a join, a generic plan made while few runs were running
      -- scanned every running run for it.
      AND (SELECT r.status FROM runs_run AS r WHERE r.id = s.run_id) = 'running'
    RETURNING s.id, s.run_id, s.attempt_number, s.attempts, s.task_id, s.generation, s.name,
              s.tool, s.params, s."when", s.timeout_ms, s.handler_for_id, s.dispatched_at,
              s.status_changed_at, s.rate_limits
), event AS (
    INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    SELECT run_id, attempt_number, 'step', id::text, 'transition', 'pending', 'running',
           a_worker, '', jsonb_build_object('attempt', attempts), a_now
    FROM claimed
)
SELECT 'claimed'::text, NULL::smallint, NULL::bigint, NULL::bigint,
       NULL::varchar, NULL::bigint, NULL::uuid, NULL::smallint, NULL::varchar,
       to_jsonb(claimed) || jsonb_build_object('more', EXISTS (
        SELECT 1 FROM runs_step AS other
        WHERE other.run_id = v_claim_run
          AND other.status = 'pending'
          AND other.dispatched_at IS NOT NULL
          AND (other.next_run_at IS NULL OR other.next_run_at <= a_now)
          AND other.id <> claimed.id
    )) || jsonb_build_object('waited', EXTRACT(EPOCH FROM a_now - v_locking))
FROM claimed;
    END IF;
    -- The run's heartbeat (when due: outcomes._beat_due), last: its row is locked only
    -- from here to the commit.
    IF a_now - COALESCE(v_heartbeat, a_now) > interval '5 seconds' THEN
        UPDATE runs_run SET last_heartbeat = a_now WHERE id = a_run;
    END IF;
END
$engine$
"""


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0019_engine_leaf_recording"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="rate_limited",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name="step",
            name="rate_limits",
            field=models.JSONField(blank=True, db_default=[], default=list),
        ),
        migrations.AddField(
            model_name="step",
            name="waiting_reason",
            field=models.CharField(blank=True, db_default="", default="", max_length=120),
        ),
        migrations.AddIndex(
            model_name="step",
            index=models.Index(
                condition=models.Q(("waiting_reason", ""), _negated=True),
                fields=["waiting_reason"],
                name="step_rate_waiting",
            ),
        ),
        migrations.RunSQL(
            sql=["DROP FUNCTION IF EXISTS engine_step_completed", CREATE],
            reverse_sql=["DROP FUNCTION IF EXISTS engine_step_completed", PREVIOUS],
        ),
    ]
