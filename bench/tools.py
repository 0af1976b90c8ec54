"""The tool `make bench`'s runner_jobs scenario serves with `orch worker bench.tools`."""

from __future__ import annotations

from orchestrator_client.tools import tool


@tool(name="bench.noop", version="1")
def noop() -> None:
    """Do nothing: a job's cost is the worker's and the protocol's alone."""
