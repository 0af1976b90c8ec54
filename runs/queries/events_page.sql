-- A page of a run's history by id (GET /runs/{id}/events: runs.selectors.events_page),
-- each event with its path in the plan (runs.event_path), in ascending id: the `limit`
-- events just after %(above)s (or, %(descending)s, just before %(below)s), among those
-- with an id strictly between the two. The history is runs.run_history, the event rows
-- and the events kept on the steps' rows: the page is a merge of its parts' (run, id)
-- indexes, each cut by the bounds, whichever way it goes, and stops at `limit`.
-- %(run)s; %(attempt)s, %(kind)s (NULL: any; runs.filters.EventFilter names them);
-- %(above)s, %(below)s, %(descending)s, %(limit)s.
WITH page AS (
    (
        SELECT * FROM runs.run_history
        WHERE run_id = %(run)s AND id > %(above)s AND id < %(below)s AND NOT %(descending)s
          AND (%(attempt)s::integer IS NULL OR attempt_number = %(attempt)s::integer)
          AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
        ORDER BY id
        LIMIT %(limit)s
    )
    UNION ALL
    (
        SELECT * FROM runs.run_history
        WHERE run_id = %(run)s AND id > %(above)s AND id < %(below)s AND %(descending)s
          AND (%(attempt)s::integer IS NULL OR attempt_number = %(attempt)s::integer)
          AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
        ORDER BY id DESC
        LIMIT %(limit)s
    )
)
SELECT e.id, e.attempt_number, e.entity, e.entity_id, e.kind, e.from_status, e.to_status,
       e.actor, e.message, e.payload, e.created_at, named.path
FROM page AS e
CROSS JOIN LATERAL runs.event_path(e.entity, e.entity_id) named
ORDER BY e.id
