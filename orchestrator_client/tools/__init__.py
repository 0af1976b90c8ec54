"""Your code as steps: ``@tool`` makes a typed Python function a tool that plans name in
their steps, run in the Celery fleet (a package installed there, declared under the
entry-point group ``orchestrator.tools``) or on your own hosts (``orch worker``,
``Worker``). docs/tools.md tells the whole story.

    from orchestrator_client.tools import Context, tool

    @tool(name="acme.summarize")
    def summarize(ctx: Context, text: str, max_words: int = 50) -> str:
        '''Summarize a text.'''
        ctx.heartbeat({"words": len(text.split())})
        return " ".join(text.split()[:max_words])
"""

from __future__ import annotations

from orchestrator_client.tools.context import Context
from orchestrator_client.tools.definition import Outcome, Tool, tool
from orchestrator_client.tools.failures import Cancelled, ToolFailure

__all__ = ["Cancelled", "Context", "Outcome", "Tool", "ToolFailure", "tool"]
