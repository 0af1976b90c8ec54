"""The fleet's published tools: packages installed beside the workers that declare tools
written with the client's ``@tool`` under the entry-point group ``orchestrator.tools``
(docs/tools.md, "On the fleet").

    [project.entry-points."orchestrator.tools"]
    acme = "acme_tools.fleet"          # a module: every tool in it; or "module:attribute"

``load`` (at start-up, from the app config) imports those named by
``ORCHESTRATOR_TOOL_PACKAGES`` (entry-point or distribution names; ``*``, the default,
for every one installed) and registers each tool (``registry.register_published``), so
that a step ``{"tool": "acme.summarize"}`` runs here like a built-in tool: claimed,
fenced, timed out, retried and charged by the engine. A Celery worker, once ready,
publishes their definitions to the catalogue (``runs.catalogue.publish``), which the API
checks plans against. What a tool raises is classified as the client says
(``orchestrator_client.tools.failures``); a cancel reaches it through its context.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from importlib import metadata
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_ready
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections

from common.tools import registry
from common.tools.base import ToolContext, ToolError, ToolResult, ToolSpec, all_stored
from common.tools.published import DEMANDS
from orchestrator_client.tools import Context, Tool
from runs import catalogue
from runs.models import Step

logger = logging.getLogger(__name__)

GROUP = "orchestrator.tools"
EVERY = "*"
# Raised inside a tool by what runs it, not by the tool: the executor handles them (a
# timed-out step, a database gone under the cancellation check).
_PASS_THROUGH = (SoftTimeLimitExceeded, OperationalError, InterfaceError)

_loaded: dict[str, Tool[Any]] = {}


def tools_in(value: Any) -> list[Tool[Any]]:
    """The tools an entry point names: a tool, a module's (every ``Tool`` in it), or a
    list of them."""
    if isinstance(value, Tool):
        return [value]
    if isinstance(value, list | tuple):
        return [item for item in value if isinstance(item, Tool)]
    return [item for item in vars(value).values() if isinstance(item, Tool)]


def _wanted(entry: metadata.EntryPoint, names: Iterable[str]) -> bool:
    chosen = set(names)
    distribution = entry.dist.name if entry.dist is not None else ""
    return EVERY in chosen or entry.name in chosen or distribution in chosen


def load(names: Iterable[str] | None = None) -> list[Tool[Any]]:
    """Import the chosen packages' tools and register them (once); return them. A tool
    name two packages declare is refused at start, naming both."""
    registry.use_remote(remote)
    wanted = list(settings.ORCHESTRATOR_TOOL_PACKAGES if names is None else names)
    for entry in metadata.entry_points(group=GROUP):
        if _wanted(entry, wanted):
            register(tools_in(entry.load()), source=f"entry point {entry.name}")
    return list(_loaded.values())


def register(tools: Iterable[Tool[Any]], *, source: str) -> None:
    """Run ``tools`` on this worker, published with the others once it is ready: what
    ``load`` does with an entry point's (``source`` names where they came from). A tool
    name declared twice is refused, naming both."""
    for found in tools:
        known = _loaded.get(found.name)
        if known is not None and known is not found:
            raise RuntimeError(
                f"tool {found.name} is declared twice: by {known.function.__module__} and "
                f"by {found.function.__module__} ({source})"
            )
        _loaded[found.name] = found
        registry.register_published(found.name, _runner_of(found))


def loaded() -> list[Tool[Any]]:
    return list(_loaded.values())


def publish(hostname: str) -> int:
    """Tell the catalogue what this worker's packages offer; how many tools."""
    tools = loaded()
    if tools:
        definitions = [catalogue.definition_from(tool.definition()) for tool in tools]
        catalogue.publish(organization=None, definitions=definitions, by=hostname)
        logger.info("published %d tools: %s", len(tools), ", ".join(t.name for t in tools))
    return len(tools)


@worker_ready.connect
def _publish_when_ready(sender: Any = None, **kwargs: Any) -> None:
    hostname = str(getattr(sender, "hostname", "") or "worker")
    try:
        publish(hostname)
    finally:
        close_old_connections()


# --------------------------------------------------------------------------- running
def remote(name: str) -> ToolSpec:
    """A published tool not installed here, an organization's worker tool: its step is
    handed to a worker that offers it, as a job (``runs.engine.waiting``), and waits with
    no Celery worker held, as a `runner` step does. Its params are kept with the job, so
    they may not hold a secret (``all_stored``; the plan's checks refuse one too)."""

    def run(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
        given = dict(params)
        demands = given.pop(DEMANDS, None) or {}
        wait = {"kind": "runner_job", "tool": name, "params": given, "demands": demands}
        return ToolResult(wait=wait)

    return ToolSpec(name, run, stored=all_stored)


def step_path(step_id: int) -> str:
    """``agent.task.step`` of a step (asked for by the tool, read then)."""
    names = (
        Step.objects.filter(pk=step_id)
        .values_list("task__agent__name", "task__name", "name")
        .first()
    )
    return ".".join(names) if names else ""


def _runner_of(tool: Tool[Any]) -> Any:
    def run(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
        context = Context(
            run_id=ctx.run_id,
            step_id=ctx.step_id,
            attempt=ctx.attempt,
            step_path=lambda: step_path(ctx.step_id),
            timeout_s=ctx.timeout_s,
            progress=ctx.progress,
            stop_requested=ctx.stop_requested,
            upload=ctx.save_artifact,
        )
        outcome = tool.run(params, context, passing=_PASS_THROUGH)
        if outcome.failure is not None:
            failure = outcome.failure
            raise ToolError(failure.code, failure.message, failure.retryable)
        return ToolResult(output=outcome.output, cost=outcome.cost)

    return run
