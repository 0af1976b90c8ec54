from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.runs.engine.harness import EngineRun, RecordingTransport


@pytest.fixture
def engine_run(
    db: None, transport: RecordingTransport, django_capture_on_commit_callbacks: Any
) -> Callable[..., EngineRun]:
    """Start and pick up a run of the given plan, in this process."""

    def start(spec: dict[str, Any], **options: Any) -> EngineRun:
        return EngineRun(spec, transport, django_capture_on_commit_callbacks, **options)

    return start
