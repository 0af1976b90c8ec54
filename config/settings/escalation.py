"""The engine's policy layer (docs/configuration.md, "Escalation and re-plan";
docs/escalation.md): when a failing run escalates, how on-call is told (webhook and
e-mail), and when a run is re-planned, by which planners."""

from __future__ import annotations

from config.settings.environment import env

# --------------------------------------------------------------------------- escalation
# The engine's policy layer (docs/escalation.md): when a failing run goes to people
# (ESCALATED, a ticket, on-call notified) and when it is re-planned. Each threshold is a
# default a plan's `escalation` and `replan` may override per run.
ESCALATION_WINDOW = env.integer(
    "ESCALATION_WINDOW", 300, "seconds of failures an escalation trigger looks back", minimum=1
)
ESCALATION_MAX_ERRORS = env.integer(
    "ESCALATION_MAX_ERRORS", 5, "failed attempts in the window beyond which a run escalates",
    minimum=0,
)  # fmt: skip
ESCALATION_MAX_ERROR_RATE = env.number(
    "ESCALATION_MAX_ERROR_RATE", 0.5, "failed/all attempts in the window beyond which it escalates"
)
ESCALATION_MIN_ATTEMPTS = env.integer(
    "ESCALATION_MIN_ATTEMPTS", 10, "attempts the window must hold before the rate counts",
    minimum=1,
)  # fmt: skip
if not 0 <= ESCALATION_MAX_ERROR_RATE <= 1:
    env.errors.append(
        f"ESCALATION_MAX_ERROR_RATE must be from 0 to 1, got {ESCALATION_MAX_ERROR_RATE}"
    )
# Notifications: a webhook per organization, retried with exponential backoff from
# ESCALATION_WEBHOOK_BACKOFF seconds, at most ESCALATION_WEBHOOK_ATTEMPTS deliveries;
# e-mail through Django's backend (the console by default) to the on-call addresses.
ESCALATION_WEBHOOK_ATTEMPTS = env.integer(
    "ESCALATION_WEBHOOK_ATTEMPTS", 6, "deliveries of an escalation webhook", minimum=1
)
ESCALATION_WEBHOOK_BACKOFF = env.number(
    "ESCALATION_WEBHOOK_BACKOFF", 10, "seconds before the first webhook retry (then doubled)"
)
ESCALATION_WEBHOOK_TIMEOUT = env.number(
    "ESCALATION_WEBHOOK_TIMEOUT", 10, "seconds a webhook delivery may take"
)

EMAIL_BACKEND = env.string(
    "EMAIL_BACKEND",
    "django.core.mail.backends.console.EmailBackend",
    "Django e-mail backend for on-call notices",
)
EMAIL_HOST = env.string("EMAIL_HOST", "localhost", "SMTP host (smtp backend)")
EMAIL_PORT = env.integer("EMAIL_PORT", 25, "SMTP port", minimum=1, maximum=65535)
EMAIL_HOST_USER = env.string("EMAIL_HOST_USER", "", "SMTP user")
EMAIL_HOST_PASSWORD = env.string("EMAIL_HOST_PASSWORD", "", "SMTP password")
EMAIL_USE_TLS = env.boolean("EMAIL_USE_TLS", False, "SMTP STARTTLS")
DEFAULT_FROM_EMAIL = env.string(
    "DEFAULT_FROM_EMAIL", "orchestrator@localhost", "sender of on-call notices"
)

# Re-plan: when more than REPLAN_AGENT_FAILURE_RATIO of a running run's agents failed, or
# more than REPLAN_TASK_FAILURES of its tasks, a planner proposes new agents, at most
# REPLAN_MAX times per run. Planners are callables by dotted path; a plan picks one by
# name (`replan.planner`), ORCH_PLANNER when it does not.
REPLAN_AGENT_FAILURE_RATIO = env.number(
    "REPLAN_AGENT_FAILURE_RATIO", 0.5, "failed/all agents beyond which a running run re-plans"
)
REPLAN_TASK_FAILURES = env.integer(
    "REPLAN_TASK_FAILURES", 10, "failed tasks beyond which a running run re-plans", minimum=0
)
REPLAN_MAX = env.integer("REPLAN_MAX", 2, "re-plans a run may make", minimum=0)
ORCH_PLANNERS: dict[str, str] = {
    "rules": "runs.people.planners.rule_planner",
    "llm": "orchestrator.llm_planner.llm_planner",
}
for _entry in env.strings(
    "ORCH_PLANNERS", [], "more planners a plan may name: name=dotted.path,name=dotted.path"
):
    _name, _, _path = _entry.partition("=")
    if not _name.strip() or not _path.strip():
        env.errors.append(f"ORCH_PLANNERS: {_entry!r} is not name=dotted.path")
    else:
        ORCH_PLANNERS[_name.strip()] = _path.strip()
ORCH_PLANNER = env.string("ORCH_PLANNER", "rules", "the planner of plans that name none")
if ORCH_PLANNER not in ORCH_PLANNERS:
    env.errors.append(f"ORCH_PLANNER {ORCH_PLANNER!r} is not one of {', '.join(ORCH_PLANNERS)}")
ORCH_PLANNER_TIMEOUT = env.number(
    "ORCH_PLANNER_TIMEOUT", 60, "seconds a planner (an LLM call) may take"
)
if not 0 <= REPLAN_AGENT_FAILURE_RATIO <= 1:
    env.errors.append(
        f"REPLAN_AGENT_FAILURE_RATIO must be from 0 to 1, got {REPLAN_AGENT_FAILURE_RATIO}"
    )
