"""The tool registry: the names a plan may use in `tool:`, and their implementations.

Plans are validated against ``tool_names()`` (and each tool's parameter validator)
before anything is stored. Built-in tools register themselves when
``orchestrator.tools.builtin`` is imported, which the app config does at start-up.
"""

from __future__ import annotations

from common.tools.base import (
    ParamValidator,
    StoredParams,
    Tool,
    ToolSpec,
    VerbatimParams,
    no_verbatim,
    nothing_stored,
)

# Named by SPEC sections 5 and 9, and seed 003's asynchronous operations.
BUILTIN_TOOLS = frozenset(
    {
        "noop",
        "echo",
        "sleep",
        "wait",
        "fail",
        "http",
        "python",
        "llm",
        "approval",
        "runner",
        "run",
        "callback",
        "poll",
    }
)

# Tools that a worker never executes: the step waits for something outside.
WAITING_TOOLS = frozenset({"approval"})

_registry: dict[str, ToolSpec] = {}


def register(
    name: str,
    run: Tool | None,
    validate: ParamValidator | None = None,
    verbatim: VerbatimParams = no_verbatim,
    stored: StoredParams = nothing_stored,
) -> None:
    _registry[name] = ToolSpec(name, run, validate, verbatim, stored)


def tool_names() -> frozenset[str]:
    return BUILTIN_TOOLS | frozenset(_registry)


def get(name: str) -> ToolSpec | None:
    return _registry.get(name)
