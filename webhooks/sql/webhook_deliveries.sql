-- The webhook deliveries, written by PostgreSQL in the transaction of the change they
-- announce, whatever code made it (runs.transitions, runs.step_completed, a sweep):
-- a run's status entering completed, failed, cancelled or waiting_approval
-- (`run.<status>`), and an escalation ticket opened (`escalation.opened`), insert one
-- pending delivery per enabled endpoint of the organization that subscribes to the
-- event. An endpoint that subscribes but is disabled gets a run event instead, in the
-- run's timeline, saying so. Sent by webhooks.services / orchestrator.webhooks
-- (docs/webhooks.md).

-- What a delivery says of its run.
CREATE FUNCTION webhooks.webhook_run(r runs_run) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', r.id, 'name', r.name, 'status', r.status, 'attempt_number', r.attempt_number,
        'priority', r.priority, 'parent_run', r.parent_run_id, 'created_at', r.created_at,
        'started_at', r.started_at, 'completed_at', r.completed_at,
        'status_changed_at', r.status_changed_at, 'last_error', r.last_error,
        'cancel_reason', r.cancel_reason)
$$;

-- One event of a run to its organization's endpoints: a pending delivery for each enabled
-- one that subscribes, a run event for each disabled one that does.
CREATE FUNCTION webhooks.webhook_deliveries_add(r runs_run, p_event text, p_payload jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhooks_webhookdelivery
        (uid, endpoint_id, run_id, event_type, payload, status, attempts, next_attempt_at,
         created_at, last_error)
    SELECT gen_random_uuid(), e.id, r.id, p_event, p_payload, 'pending', 0,
           clock_timestamp(), clock_timestamp(), ''
    FROM webhooks_webhookendpoint AS e
    WHERE e.organization_id = r.organization_id AND e.enabled AND p_event = ANY (e.events)
    ORDER BY e.id;
    INSERT INTO runs_runevent (run_id, attempt_number, entity, entity_id, kind,
                               from_status, to_status, actor, message, payload, created_at)
    SELECT r.id, r.attempt_number, 'webhook', e.id::text, 'error', '', '', 'webhooks',
           'webhook endpoint ' || e.url || ' is disabled (' || e.disabled_reason
               || '): ' || p_event || ' was not sent to it',
           jsonb_build_object('endpoint', e.id, 'url', e.url, 'event', p_event,
                              'disabled_at', e.disabled_at, 'reason', e.disabled_reason),
           clock_timestamp()
    FROM webhooks_webhookendpoint AS e
    WHERE e.organization_id = r.organization_id AND NOT e.enabled
      AND p_event = ANY (e.events);
END
$$;

CREATE FUNCTION webhooks.webhook_run_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM webhooks.webhook_deliveries_add(
        NEW, 'run.' || NEW.status, jsonb_build_object('run', webhooks.webhook_run(NEW)));
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER webhooks_run_event
AFTER UPDATE OF status ON runs_run
FOR EACH ROW
WHEN (NEW.status IS DISTINCT FROM OLD.status
      AND NEW.status IN ('completed', 'failed', 'cancelled', 'waiting_approval'))
EXECUTE FUNCTION webhooks.webhook_run_event();

CREATE FUNCTION webhooks.webhook_escalation_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r runs_run;
BEGIN
    SELECT * INTO r FROM runs_run WHERE id = NEW.run_id;
    PERFORM webhooks.webhook_deliveries_add(r, 'escalation.opened', jsonb_build_object(
        'escalation', jsonb_build_object(
            'id', NEW.id, 'status', NEW.status, 'reason', NEW.reason,
            'severity', NEW.severity, 'errors', NEW.errors,
            'opened_at', NEW.opened_at, 'note', NEW.note),
        'run', webhooks.webhook_run(r)));
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER webhooks_escalation_event
AFTER INSERT ON runs_escalationticket
FOR EACH ROW EXECUTE FUNCTION webhooks.webhook_escalation_event();
