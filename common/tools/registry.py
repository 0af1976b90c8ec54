"""The tool registry: the names a plan may use in `tool:`, and their implementations.

Plans are validated against ``tool_names()`` (and each tool's parameter validator)
before anything is stored. Built-in tools register themselves when
``orchestrator.tools.builtin`` is imported, which the app config does at start-up.

Published tools (``common.tools.published``: dotted names, checked against the
catalogue's schemas) are found here too: those of the packages installed on this worker
(``register_published``, at start), and any other through ``use_remote``'s factory, which
hands the step to a worker that offers it (a runner job).
"""

from __future__ import annotations

from collections.abc import Callable

from common.tools.base import (
    ParamValidator,
    StoredParams,
    Tool,
    ToolSpec,
    VerbatimParams,
    no_verbatim,
    nothing_stored,
)
from common.tools.published import is_published_name

# The built-in tools: the steps a worker runs itself (noop ... llm), and those the engine
# parks on something outside: a person, a runner job, a child run, a callback, a poll.
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
# Published tools installed here (the fleet's), and what runs the others.
_published: dict[str, ToolSpec] = {}
_remote: Callable[[str], ToolSpec | None] = lambda name: None  # noqa: E731


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


def register_published(name: str, run: Tool) -> None:
    """A published tool of a package installed on this worker (the fleet's)."""
    _published[name] = ToolSpec(name, run)


def published_here() -> frozenset[str]:
    return frozenset(_published)


def use_remote(factory: Callable[[str], ToolSpec | None]) -> None:
    """How a published tool not installed here runs (a runner job for its workers)."""
    global _remote
    _remote = factory


def get(name: str) -> ToolSpec | None:
    found = _registry.get(name) or _published.get(name)
    if found is None and is_published_name(name):
        return _remote(name)
    return found
