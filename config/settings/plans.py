"""What a submitted plan may be (docs/configuration.md, "Plans")."""

from __future__ import annotations

from config.settings.engine import RUN_MAX_DEPTH
from config.settings.environment import env

# --------------------------------------------------------------------------- run plans
# Size limits of a submitted plan (runs/plan/): beyond them it is refused, whole.
ORCHESTRATOR_PLAN_LIMITS = {
    "max_spec_bytes": env.integer(
        "PLAN_MAX_BYTES", 1_000_000, "largest accepted plan, bytes of JSON", minimum=1000
    ),
    "max_agents": env.integer("PLAN_MAX_AGENTS", 100, "agents per run", minimum=1),
    "max_tasks_per_agent": env.integer(
        "PLAN_MAX_TASKS_PER_AGENT", 5000, "tasks per agent", minimum=1
    ),
    "max_steps_per_task": env.integer("PLAN_MAX_STEPS_PER_TASK", 5000, "steps per task", minimum=1),
    "max_steps_per_run": env.integer("PLAN_MAX_STEPS_PER_RUN", 20000, "steps per run", minimum=1),
    "max_on_error": 5,
    # A child run's plan may be written inside its parent's, RUN_MAX_DEPTH levels deep:
    # each level is 8 levels of JSON (plan, agents, agent, tasks, task, steps, step,
    # params) above the 32 a plan may use.
    "max_json_depth": 32 + 8 * RUN_MAX_DEPTH,
    "max_variables_bytes": 100_000,
    "max_retry_attempts": 20,
    "max_step_timeout_ms": env.integer(
        "PLAN_MAX_STEP_TIMEOUT", 3600, "longest step timeout a plan may ask, seconds", minimum=1
    )
    * 1000,
}
