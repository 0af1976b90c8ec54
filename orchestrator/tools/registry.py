"""The tool registry: the names a plan may use in `tool:`, and their implementations.

Plans are validated against ``tool_names()`` before anything is stored. The built-in
names of SPEC section 5 are always known; implementations register themselves with
``register()`` when the engine loads them.
"""

from __future__ import annotations

from typing import Any

BUILTIN_TOOLS = frozenset(
    {"noop", "echo", "sleep", "fail", "http", "python", "llm", "approval", "runner", "run"}
)

# Tools that a worker never executes: the step waits for something outside.
WAITING_TOOLS = frozenset({"approval"})

_registry: dict[str, Any] = {}


def register(name: str, implementation: Any) -> None:
    _registry[name] = implementation


def tool_names() -> frozenset[str]:
    return BUILTIN_TOOLS | frozenset(_registry)


def get(name: str) -> Any:
    return _registry[name]
