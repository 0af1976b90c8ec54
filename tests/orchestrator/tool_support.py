"""Calling a built-in tool directly in a test: its ``ToolContext``, the ``ToolError`` it
raises, a stop that comes after some checks, and an address nobody listens on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from common.tools.base import ToolContext, ToolError, ToolResult
from tests.support import free_port

Tool = Callable[[dict[str, Any], ToolContext], ToolResult]


def context(
    *,
    attempt: int = 1,
    timeout_s: float | None = None,
    stop_requested: Callable[[], bool] = lambda: False,
) -> ToolContext:
    return ToolContext(
        step_id=1,
        run_id="00000000-0000-0000-0000-000000000001",
        attempt=attempt,
        timeout_s=timeout_s,
        stop_requested=stop_requested,
    )


def failure(tool: Tool, params: dict[str, Any], ctx: ToolContext | None = None) -> ToolError:
    with pytest.raises(ToolError) as caught:
        tool(params, ctx or context())
    return caught.value


class StopAfter:
    """A stop_requested that answers False `checks` times, then True; counts its calls."""

    def __init__(self, checks: int) -> None:
        self.checks = checks
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls > self.checks


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"
