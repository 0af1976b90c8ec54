-- A page of a run's steps of one attempt (GET /runs/{id}/steps: runs.selectors.
-- steps_page), in plan order, each with the names of its task and agent, the work its
-- current attempt started (runs.step_work; a worker tool's job, by the job's unique
-- (step, attempt) index), what its tool last said of its progress in that attempt (a
-- worker tool's on its job, a fleet tool's on the step's row) and how many steps match
-- in all (`total`, on every row). The page is cut on the ordering keys alone; the steps'
-- columns (JSON parameters and outputs) are read for the page's rows only.
-- %(run)s; %(attempt)s (NULL: the run's current attempt), %(task)s, %(status)s,
-- %(tool)s (NULL: any; runs.filters.StepFilter names them); %(limit)s, %(offset)s.
SELECT s.id, s.task_id, page.task_name, page.agent_name, s.name, s.attempt_number,
       s.generation, s.position, s.tool, s.params, s."when", s.depends_on, s.handler_for_id,
       s.status, s.attempts, s.failures, s.reclaims, s.next_run_at, s.waiting_reason,
       s.rate_limits, s.output, s.error, s.handled, s.cost, s.reused_from, s.cached_from,
       s.created_at, s.started_at, s.completed_at, s.duration_ms, s.waited_ms,
       CASE s.tool WHEN 'runner' THEN started.work ELSE tool_job.id END AS job,
       CASE s.tool WHEN 'run' THEN started.work END AS child_run,
       CASE WHEN tool_job.attempt = s.attempts THEN tool_job.progress
            WHEN (s.progress ->> 'attempt')::integer = s.attempts THEN s.progress -> 'value'
       END AS progress,
       page.total
FROM (
    SELECT s.id, t.name AS task_name, a.name AS agent_name, count(*) OVER () AS total,
           a.position AS agent_position, t.generation AS task_generation,
           t.position AS task_position, s.generation, s.position
    FROM runs_step s
    JOIN runs_task t ON t.id = s.task_id
    JOIN runs_agent a ON a.id = t.agent_id
    WHERE s.run_id = %(run)s
      AND s.attempt_number = COALESCE(
          %(attempt)s::integer, (SELECT attempt_number FROM runs_run WHERE id = %(run)s)
      )
      AND (%(task)s::bigint IS NULL OR s.task_id = %(task)s::bigint)
      AND (%(status)s::text IS NULL OR s.status = %(status)s::text)
      AND (%(tool)s::text IS NULL OR s.tool = %(tool)s::text)
    ORDER BY a.position, t.generation, t.position, s.generation, s.position, s.id
    LIMIT %(limit)s OFFSET %(offset)s
) page
JOIN runs_step s ON s.id = page.id
CROSS JOIN LATERAL runs.step_work(s.id, s.tool) started
-- A published tool's name has a dot, a built-in tool's none: only the former have jobs.
LEFT JOIN LATERAL (
    SELECT j.id, j.attempt, j.progress FROM runs_runnerjob AS j
    WHERE strpos(s.tool, '.') > 0 AND j.step_id = s.id
    ORDER BY j.attempt DESC
    LIMIT 1
) AS tool_job ON true
ORDER BY page.agent_position, page.task_generation, page.task_position, page.generation,
         page.position, page.id
