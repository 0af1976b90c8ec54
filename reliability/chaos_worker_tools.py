"""The tool ``make chaos``'s `orch worker` serves (reliability/stack.py,
``start_worker``): it posts its step's attempt to the harness's effect endpoint, as the
`http` effect steps and the reference runner's jobs do, so that an attempt executed twice
shows in the same book."""

from __future__ import annotations

import os

import httpx

from orchestrator_client.tools import Context, tool


@tool(name="chaos.effect", version="1", errors={httpx.TransportError: "connection_error"})
def effect(ctx: Context) -> dict[str, str]:
    """Post this attempt (run, step, attempt) to ``ORCH_EFFECT_URL``."""
    body = {"run": ctx.run_id, "step": ctx.step_id, "attempt": ctx.attempt, "hold": 0}
    httpx.post(os.environ["ORCH_EFFECT_URL"], json=body, timeout=10).raise_for_status()
    return {"done": ctx.job_id}
