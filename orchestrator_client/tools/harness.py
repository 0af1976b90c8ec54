"""Test a tool without a server: ``call`` runs it with a step's params and a
``FakeContext``, as the fleet or a worker would, and returns its ``Outcome``.

    from orchestrator_client.tools.harness import FakeContext, call

    def test_summarize_keeps_the_first_words():
        outcome = call(summarize, {"text": "one two three", "max_words": 2})
        assert outcome.output == {"summary": "one two"}

    def test_summarize_stops_when_cancelled():
        context = FakeContext(cancel_after=1)     # a stop comes with the first heartbeat
        assert call(long_tool, {}, context=context).failure.code == "cancelled"

The params go through the same conversion as on a worker (an unknown or missing one, a
value of the wrong type: ``invalid_input``), the output through the same encoding (not
JSON: ``invalid_output``), and what the tool raises through the same classification.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, BinaryIO

from orchestrator_client.tools.context import Context
from orchestrator_client.tools.definition import Outcome, Tool


class FakeContext(Context):
    """A context that keeps what the tool did: ``progress`` (every heartbeat's value),
    ``artifacts`` (name -> bytes). ``cancel_after``: a stop is asked for at that
    heartbeat (1: the first); ``cancel()`` asks at once."""

    def __init__(
        self,
        *,
        run_id: str = "run-test",
        step_id: int = 1,
        attempt: int = 1,
        step_path: str = "agent.task.step",
        cancel_after: int | None = None,
    ) -> None:
        self.progress: list[Any] = []
        self.artifacts: dict[str, bytes] = {}
        self.heartbeats = 0
        self._cancel_after = cancel_after
        super().__init__(
            run_id=run_id,
            step_id=step_id,
            attempt=attempt,
            step_path=step_path,
            progress=self.progress.append,
            upload=self._keep,
        )

    def heartbeat(self, progress: Any = None) -> None:
        self.heartbeats += 1
        if self._cancel_after is not None and self.heartbeats >= self._cancel_after:
            self.cancel()
        super().heartbeat(progress)

    def _keep(self, name: str, stream: BinaryIO, size: int, content_type: str) -> dict[str, Any]:
        data = stream.read()
        self.artifacts[name] = data
        return {
            "id": f"artifact-{len(self.artifacts)}",
            "name": name,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "content_type": content_type,
        }


def call(
    tool: Tool[Any], params: Mapping[str, Any] | None = None, *, context: Context | None = None
) -> Outcome:
    """Run ``tool`` with ``params`` (the step's, as JSON) and ``context`` (a new
    ``FakeContext`` when none is given)."""
    return tool.run(params or {}, context if context is not None else FakeContext())
