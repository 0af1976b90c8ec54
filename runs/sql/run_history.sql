-- runs.run_history: a run's history as every reader lists it (the API's events and their
-- stream, the run page, the admin: runs.selectors.run_history, runs/queries/
-- events_page.sql): the event rows (runs_runevent) and the events kept on the steps' rows,
-- each shown exactly as its row would be, with the id it was given when it happened.
--
-- A step attempt's claim (pending -> running) and its completion (running ->
-- completed, recorded by runs.step_finish) write no event row: the statement that
-- claims or completes draws the event's id from the events' sequence and keeps it on the
-- step's row (claim_event, completion_event), with what the event shows that the row does
-- not keep otherwise (claimed_at; completion_cost, the cost as the recording wrote it).
-- The id orders it among the rows as a row's would (ids are drawn when events happen),
-- and it commits with the step's row, so a cursor (a page's, the stream's Last-Event-ID)
-- means what it meant. Every other exit of an attempt (a failure, a retry, a reclaim, a
-- hand-back, a park, a cancel) writes its own event rows, as before.
--
-- Each step's row is in both steps' parts, whether it keeps such an event or not: the
-- parts where it keeps none have no id. Every reader leaves those out, by its bounds
-- (`id > %(after)s`) or by `id IS NOT NULL` (runs.models.HistoryEvent's manager). They
-- are there because a part of a union with a WHERE of its own is planned apart from the
-- query around it: without one, the planner flattens the three parts into one append of
-- index scans, and a page of a run in id order is a merge of event_run_order (run, id),
-- step_claim_event (run, claim_event) and step_completion_event (run, completion_event),
-- each cut by the page's bounds (which imply the partial indexes' conditions), reading
-- no more than the page. Their columns have the same types part by part (the casts), for
-- the same reason; a part the query's conditions rule out (`entity = 'run'`) is not read.
CREATE VIEW runs.run_history AS
SELECT e.id, e.run_id, e.attempt_number, e.entity, e.entity_id, e.kind, e.from_status,
       e.to_status, e.actor, e.message, e.payload, e.created_at
FROM runs_runevent AS e
UNION ALL
SELECT s.claim_event, s.run_id, s.attempt_number, 'step'::varchar, s.id::varchar,
       'transition'::varchar, 'pending'::varchar, 'running'::varchar, s.worker, ''::text,
       jsonb_build_object('attempt', s.attempts), s.claimed_at
FROM runs_step AS s
UNION ALL
SELECT s.completion_event, s.run_id, s.attempt_number, 'step'::varchar, s.id::varchar,
       'transition'::varchar, 'running'::varchar, 'completed'::varchar, 'system'::varchar,
       ''::text, jsonb_build_object('cost', s.completion_cost), s.completed_at
FROM runs_step AS s;

-- An event kept on a step's row is listed from it for as long as the row keeps it: an
-- attempt that fails, is retried, parked or handed back leaves its claim there, listed
-- as before. An update that would change it (the next attempt's claim, which keeps its
-- own; a park or a hand-back, which clear the worker and forget it) writes it first as
-- an event row with its id, exactly as the view showed it, so that a reader who saw it
-- at that id sees the same event at the same id after, in the same place among the
-- others. Such an update forgets it itself (claim_event NULL, or a new one) and the
-- trigger writes the row from the old version; one that changes what it shows and keeps
-- it (no such update is known: a safety net) has it written and then forgotten by a
-- second update, whose own firing finds the row written and adds nothing.
--
-- AFTER triggers: a BEFORE trigger locks the row before its condition is read, a WAL
-- record on every update of a step (and inside the recording's block, a MultiXact); an
-- AFTER trigger's condition is read against the old and new versions as the update
-- writes them, and the claim, the plain completion, a dispatch and the lease's renewals
-- fire neither.
CREATE FUNCTION runs.step_claim_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO runs_runevent
        (id, run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    VALUES (OLD.claim_event, OLD.run_id, OLD.attempt_number, 'step', OLD.id::text,
            'transition', 'pending', 'running', OLD.worker, '',
            jsonb_build_object('attempt', OLD.attempts), OLD.claimed_at)
    ON CONFLICT (id) DO NOTHING;
    IF NEW.claim_event = OLD.claim_event THEN
        UPDATE runs_step SET claim_event = NULL, claimed_at = NULL WHERE id = NEW.id;
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION runs.step_completion_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO runs_runevent
        (id, run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    VALUES (OLD.completion_event, OLD.run_id, OLD.attempt_number, 'step', OLD.id::text,
            'transition', 'running', 'completed', 'system', '',
            jsonb_build_object('cost', OLD.completion_cost), OLD.completed_at)
    ON CONFLICT (id) DO NOTHING;
    IF NEW.completion_event = OLD.completion_event THEN
        UPDATE runs_step SET completion_event = NULL, completion_cost = '' WHERE id = NEW.id;
    END IF;
    RETURN NULL;
END
$$;

-- Fired only by an update that sets one of the columns the kept claim shows: a plain
-- completion, a dispatch or a lease's renewal does not even read the condition.
CREATE TRIGGER runs_step_claim_written
AFTER UPDATE OF claim_event, claimed_at, worker, attempts, attempt_number, run_id
ON runs_step
FOR EACH ROW
WHEN (OLD.claim_event IS NOT NULL AND (
    NEW.claim_event IS DISTINCT FROM OLD.claim_event
    OR NEW.claimed_at IS DISTINCT FROM OLD.claimed_at
    OR NEW.worker IS DISTINCT FROM OLD.worker
    OR NEW.attempts IS DISTINCT FROM OLD.attempts
    OR NEW.attempt_number IS DISTINCT FROM OLD.attempt_number
    OR NEW.run_id IS DISTINCT FROM OLD.run_id
))
EXECUTE FUNCTION runs.step_claim_written();

-- A completed step is final (runs.states): only a safety net, as the claim's second case.
CREATE TRIGGER runs_step_completion_written
AFTER UPDATE OF completion_event, completion_cost, completed_at, attempt_number, run_id
ON runs_step
FOR EACH ROW
WHEN (OLD.completion_event IS NOT NULL AND (
    NEW.completion_event IS DISTINCT FROM OLD.completion_event
    OR NEW.completion_cost IS DISTINCT FROM OLD.completion_cost
    OR NEW.completed_at IS DISTINCT FROM OLD.completed_at
    OR NEW.attempt_number IS DISTINCT FROM OLD.attempt_number
    OR NEW.run_id IS DISTINCT FROM OLD.run_id
))
EXECUTE FUNCTION runs.step_completion_written();
