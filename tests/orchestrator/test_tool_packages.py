"""The fleet's published tools (orchestrator.tools.packages): loaded from the example
package's entry point, run as a built-in tool is (the step's context reaching the
function: its cancellation, its time limit passing through), and a tool no package here
installs handed to a worker as a job."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from common.tools import registry
from common.tools.base import ToolContext, ToolError
from orchestrator.tools import packages
from orchestrator_client.tools import Context, tool


def context(stop: bool = False) -> ToolContext:
    return ToolContext(
        step_id=1, run_id="run-1", attempt=2, timeout_s=30.0, stop_requested=lambda: stop
    )


def test_the_example_packages_fleet_tool_is_loaded_from_its_entry_point() -> None:
    loaded = packages.load(["acme"])

    assert [found.name for found in loaded if found.name.startswith("acme.")] == ["acme.word_stats"]
    spec = registry.get("acme.word_stats")
    assert spec is not None
    assert spec.run is not None
    result = spec.run({"text": "One. Two two."}, context())
    assert result.output == {"words": 3, "sentences": 2, "top": ["two", "one"]}
    assert result.cost == Decimal("0.01")


def test_a_cancel_reaches_the_function_through_its_context() -> None:
    seen: list[Any] = []

    @tool(name="testing.waits")
    def waits(ctx: Context) -> str:
        seen.append((ctx.run_id, ctx.attempt))
        ctx.sleep(60)
        return "never"

    with pytest.raises(ToolError) as failed:
        packages._runner_of(waits)({}, context(stop=True))

    assert (failed.value.code, failed.value.retryable) == ("cancelled", False)
    assert seen == [("run-1", 2)]


def test_a_time_limit_passes_through_the_tool_to_the_executor() -> None:
    @tool(name="testing.slow")
    def slow() -> str:
        raise SoftTimeLimitExceeded

    with pytest.raises(SoftTimeLimitExceeded):
        packages._runner_of(slow)({}, context())


def test_a_published_tool_not_installed_here_becomes_a_job_for_a_worker() -> None:
    spec = registry.get("mine.summarize")

    assert spec is not None
    assert spec.run is not None
    result = spec.run({"text": "x", "demands": {"tags": ["gpu"]}}, context())
    assert result.wait == {
        "kind": "runner_job",
        "tool": "mine.summarize",
        "params": {"text": "x"},
        "demands": {"tags": ["gpu"]},
    }
