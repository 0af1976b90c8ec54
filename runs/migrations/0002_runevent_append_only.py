"""Run events are append-only in the database itself, not only in the model."""

from django.db import migrations

FORBID = """
CREATE OR REPLACE FUNCTION runs_forbid_event_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'runs_runevent is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER runs_runevent_append_only
    BEFORE UPDATE OR DELETE ON runs_runevent
    FOR EACH ROW EXECUTE FUNCTION runs_forbid_event_change();
"""

ALLOW = """
DROP TRIGGER IF EXISTS runs_runevent_append_only ON runs_runevent;
DROP FUNCTION IF EXISTS runs_forbid_event_change();
"""


class Migration(migrations.Migration):
    dependencies = [("runs", "0001_initial")]

    operations = [migrations.RunSQL(FORBID, ALLOW)]
