-- The pending jobs a runner's poll claims (runs.waits.runners.poll): the first %(limit)s it
-- matches, by priority then age, each row locked with SKIP LOCKED so that concurrent
-- polls take different jobs. A worker tool's job (`tool` set) goes to a runner offering that tool
-- at the job's version; a `runner` step's job to a runner offering no tool (the
-- reference runner). %(runner)s, %(organization)s, %(now)s, %(hostname)s,
-- %(project_dir)s, %(executor_type)s, %(tags)s (a JSON list), %(tools)s (a JSON object,
-- tool to version), %(limit)s.
--
-- The pick is a CTE made once (MATERIALIZED), not `WHERE id IN (SELECT ... LIMIT ...)`:
-- a planner that puts such a subquery on the inner side of a nested loop runs it again
-- for every row of the outer scan, and each run's SKIP LOCKED passes over the rows this
-- statement has just claimed and returns the next ones: the poll claimed past its limit
-- and handed over only what it asked for, the rest left claimed by nobody.
WITH picked AS MATERIALIZED (
    SELECT c.id FROM runs_runnerjob AS c
    WHERE c.organization_id = %(organization)s AND c.status = 'pending'
      AND c.timeout_at > %(now)s
      AND (c.required_runner_id IS NULL OR c.required_runner_id = %(runner)s)
      AND coalesce(c.demands ->> 'hostname', %(hostname)s) = %(hostname)s
      AND coalesce(c.demands ->> 'project_dir', %(project_dir)s) = %(project_dir)s
      AND coalesce(c.demands ->> 'executor_type', %(executor_type)s) = %(executor_type)s
      AND %(tags)s::jsonb @> coalesce(c.demands -> 'tags', '[]'::jsonb)
      AND CASE WHEN c.tool = '' THEN %(tools)s::jsonb = '{}'::jsonb
               ELSE (%(tools)s::jsonb ->> c.tool) = c.tool_version END
    ORDER BY c.priority, c.created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE runs_runnerjob AS j
SET status = 'claimed', runner_id = %(runner)s, claimed_at = %(now)s
FROM picked
WHERE j.id = picked.id
RETURNING j.id
