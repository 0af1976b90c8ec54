"""Fixtures of the orchestrator's tests: the engine in process (tests/runs/engine/harness.py),
for what the worker does around a wait (a poll's readings)."""

from tests.runs.conftest import transport  # noqa: F401 - the harness's recording transport
from tests.runs.engine.conftest import engine_run  # noqa: F401
