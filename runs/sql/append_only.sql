-- A run's events are append-only in the database itself, not only in their model:
-- UPDATE and DELETE of a run event (runs_runevent) are refused, whatever the code or
-- client, by the ledger's guard (billing/sql/append_only.sql, installed before this).
CREATE OR REPLACE TRIGGER runs_runevent_append_only
BEFORE UPDATE OR DELETE ON runs_runevent
FOR EACH ROW EXECUTE FUNCTION billing.refuse_change();
