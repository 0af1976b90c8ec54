"""Version 2 of tests/integration/worker_tools.py's ``testing.count``: a new required
parameter, so a new version (tests/integration/test_worker_tools.py, the version bump)."""

from __future__ import annotations

from orchestrator_client.tools import tool


@tool(name="testing.count", version="2")
def count(to: int, by: int) -> dict[str, object]:
    """Count to ``to`` in steps of ``by``.

    Args:
        to: where to stop.
        by: the step.
    """
    return {"counted": list(range(by, to + 1, by)), "version": 2}
