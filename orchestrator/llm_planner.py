"""The LLM planner: it reaches out over HTTP, so it lives on the worker's side.

``llm_planner`` asks the OpenAI-compatible endpoint the `llm` tool uses (LLM_BASE_URL,
LLM_API_KEY, LLM_MODEL) for new agents: the request (the plan, what failed, the limits)
goes as JSON in the prompt, and the answer's content is read as a JSON plan fragment
(`{"agents": [...]}` or a bare list, in a Markdown code fence or not). An answer that is
not JSON, or not agents, is a planning failure (``PlanningFailed``); whether the agents
make a valid plan is ``runs.people.replanning``'s to check, with the same validator as any
plan. The call's token usage is kept with the re-plan; it is not charged to the run.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.conf import settings

from common.tools.base import ToolError
from orchestrator.tools.builtin import chat_completion
from runs.people.planners import PlanningFailed, PlanningRequest, Proposal

# A fence around the JSON, as chat models like to write it: ```json ... ```
_FENCE = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?```\s*$", re.DOTALL)

SYSTEM_PROMPT = """You re-plan a failing run of an orchestrator. A run is agents; an
agent has tasks; a task has steps; a step calls one tool. Some of the run's agents,
tasks or steps failed. Propose NEW agents that achieve what failed in another way.

Answer with JSON only: {"agents": [<agent>, ...]}, or {"agents": []} to propose nothing.
An agent: {"name": str, "mode": "sequential"|"parallel"|"dag", "failure_mode":
"fail-fast"|"continue"|"retry", "depends_on": [agent names] (dag runs only), "tasks":
[<task>]}. A task: {"name": str, "mode": ..., "failure_mode": ..., "steps": [<step>]}.
A step: {"name": str, "tool": one of the tools the plan uses, "params": {...},
"retry": {"max_attempts": int, "backoff": "fixed"|"linear"|"exponential",
"base_delay_ms": int}}. Names: letters, digits, "_", "-", "." only, and new agents'
names must differ from every agent of the run. Stay within the limits given."""


def llm_planner(request: PlanningRequest) -> Proposal:
    """New agents, as the LLM proposes them."""
    question = {
        "replan": request.replan,
        "trigger": request.trigger,
        "plan": request.plan,
        "agents": request.agents,
        "failures": request.failures,
        "limits": request.limits,
    }
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": json.dumps(question, default=str)},
    ]
    try:
        reply = chat_completion(messages, timeout=settings.ORCH_PLANNER_TIMEOUT)
    except ToolError as exc:
        raise PlanningFailed("planner_error", f"the LLM planner's call failed: {exc}") from None
    return Proposal(agents=fragment_of(reply.content), usage=reply.usage)


def fragment_of(content: Any) -> list[dict[str, Any]]:
    """The agents in an LLM's answer; PlanningFailed when it holds none to read."""
    if not isinstance(content, str):
        raise PlanningFailed("invalid_json", "the planner's answer is not text")
    text = content.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PlanningFailed(
            "invalid_json", f"the planner's answer is not JSON ({exc}): {text[:200]!r}"
        ) from None
    agents = data.get("agents") if isinstance(data, dict) else data
    if not isinstance(agents, list) or not all(isinstance(agent, dict) for agent in agents):
        raise PlanningFailed(
            "invalid_plan", 'the planner\'s answer is not {"agents": [...]} or a list of agents'
        )
    return agents
